package store

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The drills' record keeps the newest drill and the newest that passed;
// junk in its place is an error that names it, and the next drill
// replaces it.
func TestDrillRecord(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	if d, err := s.ReadDrills(ctx); d != nil || err != nil {
		t.Fatalf("no record yet: %v, %v", d, err)
	}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	ok := spec.DrillResult{Time: t0, Node: "a", Backup: "b1", Outcome: spec.EventOK, Revision: 10, Seconds: 2}
	failed := spec.DrillResult{Time: t0.Add(time.Hour), Node: "b", Backup: "b2", Outcome: spec.EventFailed, Message: strings.Repeat("x", 5000)}
	for _, r := range []spec.DrillResult{ok, failed} {
		if err := s.RecordDrill(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	d, err := s.ReadDrills(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Last.Backup != "b2" || d.Last.Outcome != spec.EventFailed || len(d.Last.Message) > spec.MaxEventMessage {
		t.Errorf("last drill %+v", d.Last)
	}
	if d.LastPassed == nil || d.LastPassed.Backup != "b1" || !d.LastPassed.Time.Equal(t0) {
		t.Errorf("last passed drill %+v", d.LastPassed)
	}
	if d.LastFailed == nil || d.LastFailed.Backup != "b2" || d.Failing() == nil {
		t.Errorf("last failed drill %+v", d.LastFailed)
	}
	// A drill that cannot run keeps the failure; one that passes ends it.
	if err := s.RecordDrill(ctx, spec.DrillResult{Time: t0.Add(2 * time.Hour), Node: "a", Outcome: spec.DrillNotRun}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.ReadDrills(ctx); err != nil || d.Failing() == nil || d.Failing().Backup != "b2" {
		t.Errorf("after a drill that could not run: %+v, %v", d, err)
	}
	if err := s.RecordDrill(ctx, spec.DrillResult{Time: t0.Add(3 * time.Hour), Node: "a", Backup: "b3", Outcome: spec.EventOK}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.ReadDrills(ctx); err != nil || d.Failing() != nil || d.LastFailed == nil {
		t.Errorf("after a drill that passed: %+v, %v", d, err)
	}
	// Three results whose messages JSON escapes sixfold still read back.
	ugly := strings.Repeat("\x01", 5000)
	for i, outcome := range []string{spec.EventOK, spec.EventFailed, spec.DrillNotRun} {
		if err := s.RecordDrill(ctx, spec.DrillResult{Time: t0.Add(time.Duration(4+i) * time.Hour), Node: "a", Outcome: outcome, Message: ugly}); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := s.ReadDrills(ctx); err != nil || d.LastPassed == nil || d.LastFailed == nil || d.Last.Outcome != spec.DrillNotRun {
		t.Errorf("three results with escaped messages: %+v, %v", d, err)
	}
	if err := s.RecordDrill(ctx, spec.DrillResult{Time: t0, Node: "a", Outcome: "maybe"}); !errors.Is(err, spec.ErrBadRecord) {
		t.Errorf("a drill with a bad outcome: %v", err)
	}

	for _, junk := range []string{
		`{"last":{"time":"2026-11-24T12:00:00Z","node":"a","outcome":"pwned"}}`,
		`{"last":{"time":"2026-11-24T12:00:00Z","node":"a","outcome":"ok"},"lastPassed":{"time":"2026-11-24T12:00:00Z","node":"a","outcome":"failed"}}`,
		`{"last":{"node":"a","outcome":"ok"}}`,
		`{"last":`,
		strings.Repeat(" ", spec.MaxDrillRecordSize+1),
	} {
		if err := s.Write(ctx, DrillKey, []byte(junk)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReadDrills(ctx); !errors.Is(err, spec.ErrBadRecord) || !strings.Contains(err.Error(), DrillKey) {
			t.Errorf("junk %.40q: %v", junk, err)
		}
	}
	if err := s.RecordDrill(ctx, ok); err != nil {
		t.Fatalf("replacing junk: %v", err)
	}
	if d, err := s.ReadDrills(ctx); err != nil || d.Last.Backup != "b1" {
		t.Errorf("after replacing junk: %+v, %v", d, err)
	}
}

func TestBackupFailureRecord(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	if f, err := s.ReadBackupFailure(ctx); f != nil || err != nil {
		t.Fatalf("no record yet: %v, %v", f, err)
	}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	if err := s.RecordBackupFailure(ctx, spec.BackupFailure{Time: t0, Node: "a", Kind: spec.BackupPeriodic, Message: "boom"}); err != nil {
		t.Fatal(err)
	}
	f, err := s.ReadBackupFailure(ctx)
	if err != nil || !f.Time.Equal(t0) || f.Kind != spec.BackupPeriodic || f.Message != "boom" {
		t.Errorf("read back %+v, %v", f, err)
	}
	if err := s.RecordBackupFailure(ctx, spec.BackupFailure{Time: t0, Node: "a", Kind: "sometimes"}); !errors.Is(err, spec.ErrBadRecord) {
		t.Errorf("a bad kind: %v", err)
	}
	if err := s.Write(ctx, BackupFailureKey, []byte(`{"time":"2026-11-24T12:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadBackupFailure(ctx); !errors.Is(err, spec.ErrBadRecord) {
		t.Errorf("a failure with no node: %v", err)
	}
}
