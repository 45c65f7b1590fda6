package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Kinds of full backup, as a backup's meta records them: why it was taken.
const (
	BackupPeriodic  = "periodic"   // on the backup interval
	BackupPreChange = "pre-change" // before a membership or version change
	BackupOnDemand  = "on-demand"  // a backup-now command
	BackupRestored  = "restored"   // the first of a restored cluster
)

// BackupKinds lists every kind, in the order figures show them.
var BackupKinds = []string{BackupPeriodic, BackupPreChange, BackupOnDemand, BackupRestored}

// ValidBackupKind reports whether k is one of BackupKinds.
func ValidBackupKind(k string) bool {
	for _, x := range BackupKinds {
		if k == x {
			return true
		}
	}
	return false
}

// BackupFailure is the last backup that failed, as the agent that tried
// it recorded it in the store, so that every agent reports it alike.
type BackupFailure struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node"`
	Kind    string    `json:"kind,omitempty"`
	Message string    `json:"message,omitempty"`
}

// DrillResult is the outcome of one restore drill: the newest backup
// restored into a scratch etcd, and checked against its meta.
type DrillResult struct {
	Time time.Time `json:"time"`
	// Node is the agent that ran it; Backup the backup it restored.
	Node   string `json:"node"`
	Backup string `json:"backup,omitempty"`
	// Outcome is EventOK, EventFailed (the backup did not restore as its
	// meta says) or DrillNotRun (the drill could not run: no room, the
	// store away, ...; it says nothing of the backup).
	Outcome string `json:"outcome"`
	// Revision is the restored etcd's revision, and HashKV its HashKV
	// at the backup's revision, when it was compared with the meta's.
	Revision int64   `json:"revision,omitempty"`
	HashKV   *uint32 `json:"hashKV,omitempty"`
	// Seconds is how long the drill took, fetch included.
	Seconds float64 `json:"seconds,omitempty"`
	Message string  `json:"message,omitempty"`
}

// DrillNotRun is the outcome of a drill that could not run.
const DrillNotRun = "not-run"

// DrillRecord is the store's record of restore drills: the newest, the
// newest that passed and the newest that failed.
type DrillRecord struct {
	Last       DrillResult  `json:"last"`
	LastPassed *DrillResult `json:"lastPassed,omitempty"`
	LastFailed *DrillResult `json:"lastFailed,omitempty"`
}

// Failing is the newest failed drill when no drill has passed since: a
// drill that could not run after it (no room, the store away) leaves it
// failing. Records from before LastFailed have only Last to go by.
func (d DrillRecord) Failing() *DrillResult {
	f := d.LastFailed
	if f == nil && d.Last.Outcome == EventFailed {
		f = &d.Last
	}
	if f == nil || (d.LastPassed != nil && !d.LastPassed.Time.Before(f.Time)) {
		return nil
	}
	return f
}

// MaxDrillRecordSize bounds the read of a drill or failure record: a drill
// record holds up to three results, each with a message of up to
// MaxEventMessage bytes, which JSON may escape to six times that.
const MaxDrillRecordSize = 32 << 10

// ErrBadRecord means a drill or backup-failure record cannot be used.
var ErrBadRecord = errors.New("spec: invalid record")

func (r DrillResult) validate() error {
	switch {
	case r.Time.IsZero():
		return fmt.Errorf("%w: a drill without a time", ErrBadRecord)
	case r.Node == "" || len(r.Node) > MaxEventAction:
		return fmt.Errorf("%w: a drill's node %s", ErrBadRecord, QuoteShort(r.Node))
	case len(r.Backup) > MaxEventAction:
		return fmt.Errorf("%w: a drill's backup %s", ErrBadRecord, QuoteShort(r.Backup))
	case r.Outcome != EventOK && r.Outcome != EventFailed && r.Outcome != DrillNotRun:
		return fmt.Errorf("%w: a drill's outcome %s", ErrBadRecord, QuoteShort(r.Outcome))
	case r.Revision < 0 || r.Seconds < 0:
		return fmt.Errorf("%w: a drill's revision or duration is negative", ErrBadRecord)
	case len(r.Message) > MaxEventMessage:
		return fmt.Errorf("%w: a drill's message of %d bytes, over %d", ErrBadRecord, len(r.Message), MaxEventMessage)
	}
	return nil
}

// Validate checks a drill record.
func (d DrillRecord) Validate() error {
	if err := d.Last.validate(); err != nil {
		return err
	}
	if p := d.LastPassed; p != nil {
		if err := p.validate(); err != nil {
			return err
		}
		if p.Outcome != EventOK {
			return fmt.Errorf("%w: the last passed drill did not pass", ErrBadRecord)
		}
	}
	if f := d.LastFailed; f != nil {
		if err := f.validate(); err != nil {
			return err
		}
		if f.Outcome != EventFailed {
			return fmt.Errorf("%w: the last failed drill did not fail", ErrBadRecord)
		}
	}
	return nil
}

// Validate checks a backup-failure record.
func (f BackupFailure) Validate() error {
	switch {
	case f.Time.IsZero():
		return fmt.Errorf("%w: a backup failure without a time", ErrBadRecord)
	case f.Node == "" || len(f.Node) > MaxEventAction:
		return fmt.Errorf("%w: a backup failure's node %s", ErrBadRecord, QuoteShort(f.Node))
	case f.Kind != "" && !ValidBackupKind(f.Kind):
		return fmt.Errorf("%w: a backup failure's kind %s", ErrBadRecord, QuoteShort(f.Kind))
	case len(f.Message) > MaxEventMessage:
		return fmt.Errorf("%w: a backup failure's message of %d bytes, over %d", ErrBadRecord, len(f.Message), MaxEventMessage)
	}
	return nil
}

// DecodeRecord reads and checks a drill or backup-failure record, which
// comes from the store and is untrusted.
func DecodeRecord[T interface{ Validate() error }](data []byte) (T, error) {
	var v T
	if len(data) > MaxDrillRecordSize {
		return v, fmt.Errorf("%w: %d bytes, over %d", ErrBadRecord, len(data), MaxDrillRecordSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&v); err != nil {
		return v, fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	return v, v.Validate()
}
