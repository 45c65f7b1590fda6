package etcdproc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// TrashEntry is one copy of etcd data moved to trash/.
type TrashEntry struct {
	Name string
	// Moved is when it was moved aside, from its name.
	Moved time.Time
	// Size is the bytes it holds.
	Size int64
}

// trashTimeLayout is the time in a trash entry's name: <token>-<time>.
const trashTimeLayout = "20060102T150405.000000000Z"

// TrashEntries lists the copies in trash/, oldest first. Entries whose names it
// cannot read are left out (and so never removed).
func (l Layout) TrashEntries() ([]TrashEntry, error) {
	dir := filepath.Join(l.Root, "trash")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("etcdproc: read trash: %w", err)
	}
	var out []TrashEntry
	for _, e := range entries {
		i := strings.LastIndexByte(e.Name(), '-')
		if !e.IsDir() || i < 0 {
			continue
		}
		moved, err := time.Parse(trashTimeLayout, e.Name()[i+1:])
		if err != nil {
			continue
		}
		out = append(out, TrashEntry{Name: e.Name(), Moved: moved, Size: dirSize(filepath.Join(dir, e.Name()))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Moved.Before(out[j].Moved) })
	return out, nil
}

// RemoveTrash deletes one copy from the trash.
func (l Layout) RemoveTrash(name string) error {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return fmt.Errorf("etcdproc: %q is not a trash entry", name)
	}
	if err := os.RemoveAll(filepath.Join(l.Root, "trash", name)); err != nil {
		return fmt.Errorf("etcdproc: remove trash %s: %w", name, err)
	}
	return nil
}

// TrashPolicy bounds the trash. The newest copy is always kept; older
// ones go once they are older than MaxAge, or, oldest first, while the
// trash holds more than MaxBytes (0: no bound on size). Only copies moved
// before Since (the start of the live membership, whose data supersedes
// them) are ever removed.
type TrashPolicy struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// Expired returns the entries (oldest first, as TrashEntries lists them)
// that the policy removes now, given the live membership began at since.
func (p TrashPolicy) Expired(entries []TrashEntry, now, since time.Time) []TrashEntry {
	if len(entries) < 2 || since.IsZero() {
		return nil
	}
	var total int64
	for _, e := range entries {
		total += e.Size
	}
	var out []TrashEntry
	for _, e := range entries[:len(entries)-1] { // never the newest
		if !e.Moved.Before(since) {
			continue
		}
		if (p.MaxAge > 0 && now.Sub(e.Moved) > p.MaxAge) || (p.MaxBytes > 0 && total > p.MaxBytes) {
			out = append(out, e)
			total -= e.Size
		}
	}
	return out
}

// TidyTmp removes what lies in tmp/ older than maxAge: scratch space of
// backups and restores that a crash left behind. With maxAge 0, it
// removes everything (at start, when nothing can be in use).
func (l Layout) TidyTmp(now time.Time, maxAge time.Duration) ([]string, error) {
	dir := filepath.Join(l.Root, "tmp")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("etcdproc: read tmp: %w", err)
	}
	var removed []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || (maxAge > 0 && now.Sub(info.ModTime()) <= maxAge) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return removed, fmt.Errorf("etcdproc: tidy tmp: %w", err)
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
