package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
)

// A backup records the member's HashKV at the snapshot's revision, which
// etcd computes by reading its whole database: 9 of an 8 GiB backup's
// 60 s when it waited for the snapshot's status check. The revision is
// known long before that check ends (it is the newest key's), so Take
// reads it first, quickly, and has etcd hash while the check runs.

// RevisionFunc reads a snapshot file's revision without reading the rest
// of it.
type RevisionFunc func(ctx context.Context, path string) (int64, error)

// maxRevisionOutput bounds what Take reads of a revision child's output.
const maxRevisionOutput = 64

// RevisionCommand returns a RevisionFunc that runs name with args and the
// snapshot's path, and reads the revision it prints (see RunRevision).
// Like the status check, it opens the database in a child, where a
// damaged file cannot crash the caller.
func RevisionCommand(name string, args ...string) RevisionFunc {
	return func(ctx context.Context, path string) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, revisionTimeout)
		defer cancel()
		stdout := &capped{max: maxRevisionOutput}
		stderr := &capped{max: 4 << 10}
		cmd := exec.CommandContext(ctx, name, append(slices.Clone(args), fmt.Sprintf("--%s=%d", MemoryCeilingFlag, CeilingFor(fileSize(path)).Memory), path)...)
		cmd.Stdout, cmd.Stderr = stdout, stderr
		if err := cmd.Run(); err != nil {
			return 0, fmt.Errorf("backup: read the revision of %s: %v: %s", path, err, strings.TrimSpace(stderr.String()))
		}
		rev, err := strconv.ParseInt(strings.TrimSpace(stdout.String()), 10, 64)
		if err != nil || rev < 0 {
			return 0, fmt.Errorf("backup: read the revision of %s: unreadable output %q", path, stdout.String())
		}
		return rev, nil
	}
}

// revisionTimeout bounds a revision child: it reads a few pages.
const revisionTimeout = 30 * time.Second

// RunRevision is the child side of RevisionCommand: it prints path's
// revision (see ReadRevision) under memoryCeiling bytes of memory (none
// when 0) and returns the process's exit code.
func RunRevision(path string, memoryCeiling int64, stdout, stderr io.Writer) int {
	if err := enforceCeiling(path, memoryCeiling, stderr); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	rev, err := ReadRevision(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, rev)
	return 0
}

// ReadRevision returns the revision of a snapshot db file: the main part
// of its newest key revision, as etcdutl's snapshot status reports it,
// read from the few pages on the way to that key. It checks nothing else:
// the status check still reads the whole file.
func ReadRevision(path string) (int64, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, fmt.Errorf("backup: read the revision of %s: %w", path, err)
	}
	defer db.Close()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Key.Name())
		if b == nil {
			return errors.New("no key bucket")
		}
		k, _ := b.Cursor().Last()
		if k == nil {
			return nil // no key was ever written: revision 0
		}
		// main, '_', sub, and 't' for a tombstone
		if len(k) < 17 || k[8] != '_' || len(k) > 18 || (len(k) == 18 && k[17] != 't') {
			return fmt.Errorf("a key revision of %d bytes: %x", len(k), k[:min(len(k), 32)])
		}
		rev = mvcc.BytesToRev(k[:17]).Main
		if rev < 0 {
			return fmt.Errorf("a negative revision %d", rev)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("backup: read the revision of %s: %w", path, err)
	}
	return rev, nil
}
