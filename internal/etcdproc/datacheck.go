package etcdproc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

// Start-up validation. etcd trusts its bbolt file: a page damaged by a
// crash, a bad disk or a careless hand makes it refuse to start, or start
// and serve wrong data. After an unclean exit (etcd killed, the agent
// killed, the machine lost) the node checks the file before it starts
// etcd on it again: every page of the database is walked, as bbolt's own
// consistency check does.

// ErrDamagedData means a member's database failed its consistency check.
var ErrDamagedData = errors.New("etcdproc: etcd's database is damaged")

// DataCheck is what a check of a member's database found.
type DataCheck struct {
	// Path is the database file checked.
	Path string
	// Size is its size in bytes, and Revision the newest etcd revision it
	// holds.
	Size     int64
	Revision int64
	Took     time.Duration
}

// DBPath is the bbolt file under etcd's --data-dir.
func DBPath(dataDir string) string { return filepath.Join(dataDir, "member", "snap", "db") }

// maxCheckErrors bounds the problems a check collects before it stops.
const maxCheckErrors = 10

// CheckData checks the database under etcd's data dir, which no etcd may
// hold open: bbolt's consistency check over every page, and the revision
// it holds. A damaged file wraps ErrDamagedData; a file that cannot be
// read for another reason (permissions, a lock held) is another error.
func CheckData(ctx context.Context, dataDir string) (DataCheck, error) {
	start := time.Now()
	path := DBPath(dataDir)
	res := DataCheck{Path: path}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return res, fmt.Errorf("%w: %s is missing", ErrDamagedData, path)
	case err != nil:
		return res, fmt.Errorf("etcdproc: check data: %w", err)
	case st.Size() == 0:
		return res, fmt.Errorf("%w: %s is empty", ErrDamagedData, path)
	}
	res.Size = st.Size()
	type result struct {
		rev int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		rev, err := checkDB(path)
		done <- result{rev, err}
	}()
	select {
	case r := <-done:
		res.Revision, err = r.rev, r.err
	case <-ctx.Done():
		// The check walks pages in memory and ends by itself; its result
		// is no longer wanted.
		return res, fmt.Errorf("etcdproc: check data %s: %w", path, ctx.Err())
	}
	res.Took = time.Since(start)
	return res, err
}

// checkDB opens the file read-only and checks it. A damaged page can
// send bbolt to an address outside the mapping; that fault becomes a
// panic here (SetPanicOnFault), and the panic a damaged-data error,
// rather than the agent's crash.
func checkDB(path string) (rev int64, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: reading it failed: %v", ErrDamagedData, path, r)
		}
	}()
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return 0, fmt.Errorf("etcdproc: check data: %s is locked, held by a running etcd?", path)
	case errors.Is(err, os.ErrPermission):
		return 0, fmt.Errorf("etcdproc: check data: %w", err)
	case err != nil:
		return 0, fmt.Errorf("%w: %s: %v", ErrDamagedData, path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var problems []error
		for e := range tx.Check() {
			if len(problems) < maxCheckErrors {
				problems = append(problems, e)
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%w: %s: bbolt's consistency check: %w", ErrDamagedData, path, errors.Join(problems...))
		}
		var err error
		if rev, err = headRevision(tx); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrDamagedData, path, err)
		}
		return nil
	})
	return rev, err
}

// headRevision is the newest revision the database holds, as etcd reads
// it at start: that of the last key written, or the compaction's if it
// is later (a compaction to the head keeps no key of that revision).
func headRevision(tx *bolt.Tx) (int64, error) {
	kb := tx.Bucket(schema.Key.Name())
	if kb == nil {
		return 0, errors.New("it has no key bucket")
	}
	var rev int64
	if k, _ := kb.Cursor().Last(); k != nil {
		if len(k) < 17 {
			return 0, fmt.Errorf("its key bucket holds a key of %d bytes", len(k))
		}
		rev = mvcc.BytesToRev(k[:17]).Main
	}
	if mb := tx.Bucket(schema.Meta.Name()); mb != nil {
		if v := mb.Get(schema.FinishedCompactKeyName); len(v) >= 17 {
			rev = max(rev, mvcc.BytesToRev(v[:17]).Main)
		}
	}
	return rev, nil
}

// DataChecker checks a member's database (CheckData, or CheckDataCommand
// in a child process).
type DataChecker func(ctx context.Context, dataDir string) (DataCheck, error)

// exitDamaged is the exit code of a check child that found the data
// damaged, as opposed to failing to run.
const exitDamaged = 3

// CheckDataCommand returns a DataChecker that runs name with args and
// the data dir, and reads the result it prints (see RunCheckData). bbolt
// panics on some damage in goroutines of its own, where no recover
// reaches, so a long-lived caller checks in a child: the child's crash
// on the file is reported as damage, and the caller lives on.
func CheckDataCommand(name string, args ...string) DataChecker {
	return func(ctx context.Context, dataDir string) (DataCheck, error) {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, name, append(args, dataDir)...)
		cmd.Stdout, cmd.Stderr = &stdout, &limitedWriter{w: &stderr, n: 64 << 10}
		err := cmd.Run()
		msg := strings.TrimSpace(stderr.String())
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit) && (exit.ExitCode() == exitDamaged ||
			// A damaged page can crash bbolt in one goroutine after another
			// found it: then the child may have printed that first.
			crashedOnData(exit, msg) && strings.HasPrefix(msg, ErrDamagedData.Error())):
			return DataCheck{Path: DBPath(dataDir)}, fmt.Errorf("%w%s", ErrDamagedData, strings.TrimPrefix(firstLine(msg), ErrDamagedData.Error()))
		case errors.As(err, &exit) && crashedOnData(exit, msg):
			// The Go runtime's exit on a panic or a fault reading the file.
			return DataCheck{Path: DBPath(dataDir)}, fmt.Errorf("%w: %s: reading it crashed bbolt: %s", ErrDamagedData, DBPath(dataDir), firstLine(msg))
		case err != nil:
			return DataCheck{}, fmt.Errorf("etcdproc: check data %s: %v: %s", dataDir, err, firstLine(msg))
		}
		var res DataCheck
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			return res, fmt.Errorf("etcdproc: check data %s: unreadable result %q: %w", dataDir, stdout.String(), err)
		}
		return res, nil
	}
}

// RunCheckData is the child side of CheckDataCommand: it checks the data
// dir, prints the result as JSON to stdout, and returns the process's
// exit code.
func RunCheckData(ctx context.Context, dataDir string, stdout, stderr io.Writer) int {
	res, err := CheckData(ctx, dataDir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, ErrDamagedData) {
			return exitDamaged
		}
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// CrashedOnData reports whether err, the exit of a child process that
// read a bbolt file, and the child's stderr say that it crashed on the
// file's content (see crashedOnData): for callers that run children of
// their own on such files.
func CrashedOnData(err error, stderr string) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && crashedOnData(exit, stderr)
}

// crashedOnData reports whether a child that read a database exited as
// the Go runtime exits on a panic or a fault inside bbolt, which a
// damaged file causes: a line of stderr (the whole of it, with the stack)
// starts with the runtime's words, and the stack names bbolt's code. The
// line need not be the first: bbolt checks pages in goroutines of its
// own, and the child may print what one of them found just before
// another crashes. Running out of memory, or a crash elsewhere, is no
// proof of damage.
func crashedOnData(exit *exec.ExitError, stderr string) bool {
	if exit.ExitCode() != 2 || strings.Contains(stderr, "out of memory") || !strings.Contains(stderr, "go.etcd.io/bbolt") {
		return false
	}
	for line := range strings.Lines(stderr) {
		if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") || strings.HasPrefix(line, "unexpected fault address") {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.n -= k
		if _, err := l.w.Write(p[:k]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// ReadRevision reads the newest revision of the database under etcd's
// data dir, which no etcd may hold open, without checking the rest of
// the file. A damaged file is an error, never the caller's crash.
func ReadRevision(dataDir string) (rev int64, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: reading it failed: %v", ErrDamagedData, DBPath(dataDir), r)
		}
	}()
	db, err := bolt.Open(DBPath(dataDir), 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, fmt.Errorf("etcdproc: read revision: %w", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		rev, err = headRevision(tx)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrDamagedData, DBPath(dataDir), err)
	}
	return rev, nil
}

// DataPosition is how far a member's data goes, read from its database
// with etcd stopped: what recover-quorum ranks the survivors by when some
// of them do not serve.
type DataPosition struct {
	// ConsistentIndex is the raft index of the last entry applied to
	// the database; Revision its newest revision.
	ConsistentIndex uint64
	Revision        int64
	// Members are the members the data lists (etcd 3.5 and later keep
	// them in the database), learners included.
	Members []DataMember
}

// DataMember is one member as the database lists it.
type DataMember struct {
	ID        uint64
	Name      string
	PeerURLs  []string
	IsLearner bool
}

// maxMemberRecord bounds one member's record read from a database: a
// name and a few URLs.
const maxMemberRecord = 16 << 10

// ReadPosition reads the position of the database under etcd's data dir,
// which no etcd may hold open (an etcd that holds it, stopped or not,
// makes this fail within a second). A damaged file is an error, never the
// caller's crash.
func ReadPosition(dataDir string) (pos DataPosition, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: reading it failed: %v", ErrDamagedData, DBPath(dataDir), r)
		}
	}()
	db, err := bolt.Open(DBPath(dataDir), 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return pos, fmt.Errorf("etcdproc: read the data's position: %w", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		if pos.Revision, err = headRevision(tx); err != nil {
			return err
		}
		if mb := tx.Bucket(schema.Meta.Name()); mb != nil {
			if v := mb.Get(schema.MetaConsistentIndexKeyName); len(v) == 8 {
				pos.ConsistentIndex = binary.BigEndian.Uint64(v)
			}
		}
		mb := tx.Bucket(schema.Members.Name())
		if mb == nil {
			return nil
		}
		return mb.ForEach(func(k, v []byte) error {
			if len(v) > maxMemberRecord || len(pos.Members) >= 1024 {
				return fmt.Errorf("its members bucket holds a record of %d bytes, or over 1024 records", len(v))
			}
			var m struct {
				ID        uint64   `json:"id"`
				Name      string   `json:"name"`
				PeerURLs  []string `json:"peerURLs"`
				IsLearner bool     `json:"isLearner"`
			}
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("its member record %q is not valid JSON: %w", k, err)
			}
			pos.Members = append(pos.Members, DataMember{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner})
			return nil
		})
	})
	if err != nil {
		return DataPosition{}, fmt.Errorf("%w: %s: %v", ErrDamagedData, DBPath(dataDir), err)
	}
	return pos, nil
}

// OfflineHash is a member's HashKV, computed from its database with etcd
// stopped, as etcd computes it: the CRC-32C of the key bucket's name,
// then of every key and value up to Revision, of those up to the
// compaction revision only the ones compaction keeps.
type OfflineHash struct {
	Hash            uint32
	CompactRevision int64
	// Revision is the revision hashed up to; CurrentRevision the
	// database's newest.
	Revision, CurrentRevision int64
}

// ErrHashUnknown means a stopped member's hash cannot be computed at the
// revision asked: it lies beyond the data, or before its compaction, or a
// compaction was cut short.
var ErrHashUnknown = errors.New("etcdproc: the hash is unknown at that revision")

// HashOffline computes the HashKV at rev (0: the newest revision) of the
// database under etcd's data dir, which no etcd may hold open. It reads
// the whole key bucket once.
func HashOffline(dataDir string, rev int64) (out OfflineHash, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: reading it failed: %v", ErrDamagedData, DBPath(dataDir), r)
		}
	}()
	db, err := bolt.Open(DBPath(dataDir), 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return out, fmt.Errorf("etcdproc: hash the data: %w", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		cur, err := headRevision(tx)
		if err != nil {
			return err
		}
		out.CurrentRevision = cur
		mb := tx.Bucket(schema.Meta.Name())
		// Never compacted: etcd reports -1.
		scheduled, finished := int64(-1), int64(-1)
		if mb != nil {
			if v := mb.Get(schema.FinishedCompactKeyName); len(v) >= 17 {
				finished = mvcc.BytesToRev(v[:17]).Main
			}
			if v := mb.Get(schema.ScheduledCompactKeyName); len(v) >= 17 {
				scheduled = mvcc.BytesToRev(v[:17]).Main
			}
		}
		if scheduled > finished {
			return fmt.Errorf("%w: a compaction to revision %d was cut short at %d", ErrHashUnknown, scheduled, finished)
		}
		out.CompactRevision = finished
		if rev == 0 {
			rev = cur
		}
		if rev > cur || rev < finished {
			return fmt.Errorf("%w: revision %d is outside the data's %d to %d", ErrHashUnknown, rev, finished, cur)
		}
		if rev == finished && finished > 0 {
			// etcd answers its hash at a compaction's revision from what it
			// computed as it compacted, before, under the compaction
			// before that: no reading of the data now gives that.
			return fmt.Errorf("%w: revision %d is the compaction's; etcd answers its hash from before the compaction", ErrHashUnknown, rev)
		}
		out.Revision = rev
		kb := tx.Bucket(schema.Key.Name())
		if kb == nil {
			return errors.New("it has no key bucket")
		}
		keep, err := keepAt(kb, rev)
		if err != nil {
			return err
		}
		h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
		h.Write(schema.Key.Name())
		err = kb.ForEach(func(k, v []byte) error {
			r := mvcc.BytesToRev(k[:17])
			switch {
			case r.Main > rev:
				return nil
			case r.Main <= finished && len(keep) > 0 && !keep[keepKey{r.Main, r.Sub}]:
				return nil
			case r.Main == finished && mvcc.IsTombstone(k):
				return nil
			}
			h.Write(k)
			h.Write(v)
			return nil
		})
		out.Hash = h.Sum32()
		return err
	})
	if errors.Is(err, ErrHashUnknown) {
		return OfflineHash{}, err
	}
	if err != nil {
		return OfflineHash{}, fmt.Errorf("%w: %s: %v", ErrDamagedData, DBPath(dataDir), err)
	}
	return out, nil
}

// keepAt is the revision etcd's key index keeps of each key at rev, as
// HashKV asks it: in the key's generation alive at rev, its newest
// revision at or before rev, unless that is the tombstone that ends the
// generation. The index is rebuilt from the bucket, as etcd rebuilds it
// when it starts. Revisions are unique per main revision within a key's
// history, so the set holds main revisions with their key.
func keepAt(kb *bolt.Bucket, rev int64) (map[keepKey]bool, error) {
	type entry struct {
		main, sub int64
		tomb      bool
	}
	hist := map[string][]entry{}
	err := kb.ForEach(func(k, v []byte) error {
		if len(k) != 17 && len(k) != 18 {
			return fmt.Errorf("its key bucket holds a key of %d bytes", len(k))
		}
		var kv mvccpb.KeyValue
		if err := proto.Unmarshal(v, &kv); err != nil {
			return fmt.Errorf("its key bucket holds a value that is no key-value: %w", err)
		}
		r := mvcc.BytesToRev(k[:17])
		hist[string(kv.Key)] = append(hist[string(kv.Key)], entry{r.Main, r.Sub, mvcc.IsTombstone(k)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	keep := map[keepKey]bool{}
	for _, es := range hist {
		// Generations: each ends with a tombstone; after the last
		// tombstone an empty one begins.
		var gens [][]entry
		cur := []entry{}
		for _, e := range es {
			cur = append(cur, e)
			if e.tomb {
				gens = append(gens, cur)
				cur = []entry{}
			}
		}
		gens = append(gens, cur)
		gi := 0
		for gi < len(gens)-1 && gens[gi][len(gens[gi])-1].main < rev {
			gi++
		}
		g := gens[gi]
		for i := len(g) - 1; i >= 0; i-- {
			if g[i].main <= rev {
				if !(i == len(g)-1 && gi != len(gens)-1) {
					keep[keepKey{g[i].main, g[i].sub}] = true
				}
				break
			}
		}
	}
	return keep, nil
}

// keepKey is a revision (main, sub) that the key index keeps.
type keepKey struct{ main, sub int64 }
