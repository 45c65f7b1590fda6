package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Records of outcomes that every agent reports alike, read from the
// store: the restore drills and the last failed backup. Each is one small
// object, overwritten.
const (
	DrillKey         = "control/restore-drill.json"
	BackupFailureKey = "control/backup-failure.json"
)

// ReadDrills reads the record of restore drills: nil when no drill has
// run. A damaged record is an error wrapping spec.ErrBadRecord.
func (s *Store) ReadDrills(ctx context.Context) (*spec.DrillRecord, error) {
	return readRecord[spec.DrillRecord](ctx, s, DrillKey)
}

// RecordDrill records the outcome of a drill as the newest, and as the
// newest passed or failed when it did. A damaged record is replaced.
func (s *Store) RecordDrill(ctx context.Context, r spec.DrillResult) error {
	r.Message = spec.Clip(r.Message, spec.MaxEventMessage)
	rec, err := s.ReadDrills(ctx)
	switch {
	case errors.Is(err, spec.ErrBadRecord) || rec == nil:
		rec = &spec.DrillRecord{}
	case err != nil:
		return err
	}
	rec.Last = r
	switch r.Outcome {
	case spec.EventOK:
		rec.LastPassed = &r
	case spec.EventFailed:
		rec.LastFailed = &r
	}
	return writeRecord(ctx, s, DrillKey, *rec)
}

// ReadBackupFailure reads the last failed backup: nil when none is
// recorded.
func (s *Store) ReadBackupFailure(ctx context.Context) (*spec.BackupFailure, error) {
	return readRecord[spec.BackupFailure](ctx, s, BackupFailureKey)
}

// RecordBackupFailure records a backup that failed.
func (s *Store) RecordBackupFailure(ctx context.Context, f spec.BackupFailure) error {
	f.Message = spec.Clip(f.Message, spec.MaxEventMessage)
	return writeRecord(ctx, s, BackupFailureKey, f)
}

func readRecord[T interface{ Validate() error }](ctx context.Context, s *Store, key string) (*T, error) {
	data, err := s.ReadMax(ctx, key, spec.MaxDrillRecordSize)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case errors.Is(err, ErrTooLarge):
		return nil, fmt.Errorf("store: %s: %w: %w", key, spec.ErrBadRecord, err)
	case err != nil:
		return nil, err
	}
	v, err := spec.DecodeRecord[T](data)
	if err != nil {
		return nil, fmt.Errorf("store: %s in %s: %w", key, s.url, err)
	}
	return &v, nil
}

func writeRecord[T interface{ Validate() error }](ctx context.Context, s *Store, key string, v T) error {
	if err := v.Validate(); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return s.Write(ctx, key, data)
}
