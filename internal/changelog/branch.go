package changelog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Timelines branch. A restore starts a new cluster token, so a new
// timeline, from a point of another: revisions after that point repeat
// the numbers of the old history. Each timeline a restore made records
// where it branched (wal/<timeline>/branch.json, written once), so a
// target resolves on a cluster's own history, back through the restores
// it came from, as PostgreSQL's timelines do.

// Branch is where a timeline began.
type Branch struct {
	Timeline string `json:"timeline"`
	// Parent is the timeline it was restored from, and Revision the
	// parent's revision it holds at its start. BumpRevision is how far
	// the restore moved revisions on: the new timeline starts at
	// Revision+BumpRevision, and the revisions between exist nowhere.
	Parent       string `json:"parent"`
	Revision     int64  `json:"revision"`
	BumpRevision int64  `json:"bumpRevision,omitempty"`
	// Backup is the full backup the restore started from; Time when the
	// new timeline began.
	Backup string    `json:"backup,omitempty"`
	Time   time.Time `json:"time"`
}

// maxBranchSize bounds a branch record read from the store.
const maxBranchSize = 16 << 10

// maxHistory bounds how many branches a history follows back.
const maxHistory = 1000

// BranchKey is where timeline's branch record lives.
func BranchKey(timeline string) string { return Prefix + timeline + "/branch.json" }

// Start is the first revision of the timeline.
func (b Branch) Start() int64 { return b.Revision + b.BumpRevision }

// Validate checks a branch record.
func (b Branch) Validate() error {
	switch {
	case !ValidTimeline(b.Timeline) || !ValidTimeline(b.Parent):
		return fmt.Errorf("changelog: branch %q from %q: not cluster tokens", b.Timeline, b.Parent)
	case b.Timeline == b.Parent:
		return fmt.Errorf("changelog: timeline %s cannot branch from itself", b.Timeline)
	case b.Revision < 1 || b.BumpRevision < 0:
		return fmt.Errorf("changelog: branch of %s: revision %d, bump %d", b.Timeline, b.Revision, b.BumpRevision)
	}
	return nil
}

// BranchStore is the part of the store branch records need.
type BranchStore interface {
	Create(ctx context.Context, key string, data []byte) error
	ReadMax(ctx context.Context, key string, max int64) ([]byte, error)
}

// WriteBranch records where b.Timeline began, once: a record already
// there wins (the restore that wrote it was the same one, retried).
func WriteBranch(ctx context.Context, s BranchStore, b Branch) error {
	if err := b.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	if err := s.Create(ctx, BranchKey(b.Timeline), data); err != nil && !isExists(err) {
		return fmt.Errorf("changelog: record the branch of %s: %w", b.Timeline, err)
	}
	return nil
}

// ReadBranch reads where timeline began; false when no restore made it.
func ReadBranch(ctx context.Context, s BranchStore, timeline string) (Branch, bool, error) {
	var b Branch
	data, err := s.ReadMax(ctx, BranchKey(timeline), maxBranchSize)
	if isNotFound(err) {
		return b, false, nil
	}
	if err != nil {
		return b, false, fmt.Errorf("changelog: branch of %s: %w", timeline, err)
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return b, false, fmt.Errorf("%w: %s is not valid JSON: %w", ErrCorrupt, BranchKey(timeline), err)
	}
	if err := b.Validate(); err != nil {
		return b, false, fmt.Errorf("%w: %s: %w", ErrCorrupt, BranchKey(timeline), err)
	}
	if b.Timeline != timeline {
		return b, false, fmt.Errorf("%w: %s names timeline %s", ErrCorrupt, BranchKey(timeline), b.Timeline)
	}
	return b, true, nil
}

// Link is one timeline of a history, and the branch it began with (nil
// for a timeline no restore made, or whose record is gone).
type Link struct {
	Timeline string
	Branch   *Branch
}

// History is timeline's history, newest first: the timeline itself, then
// the one it was restored from, and so on back.
func History(ctx context.Context, s BranchStore, timeline string) ([]Link, error) {
	seen := map[string]bool{}
	var out []Link
	for t := timeline; ; {
		if seen[t] || len(out) >= maxHistory {
			return nil, fmt.Errorf("%w: the branch records of timeline %s form a loop at %s", ErrCorrupt, timeline, t)
		}
		seen[t] = true
		b, ok, err := ReadBranch(ctx, s, t)
		if err != nil {
			return nil, err
		}
		if !ok {
			return append(out, Link{Timeline: t}), nil
		}
		out = append(out, Link{Timeline: t, Branch: &b})
		t = b.Parent
	}
}
