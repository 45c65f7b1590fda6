package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"google.golang.org/protobuf/proto"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// verifyChildEnv makes the test binary act as VerifyCommand's child.
const verifyChildEnv = "BACKUP_TEST_VERIFY_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(verifyChildEnv) == "1" && slices.Contains(os.Args, "--revision-only") {
		os.Exit(RunRevision(os.Args[len(os.Args)-1], childCeiling(), os.Stdout, os.Stderr))
	}
	if os.Getenv(verifyChildEnv) == "sleep" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	if os.Getenv(verifyChildEnv) == "hog" {
		os.Exit(hog())
	}
	if os.Getenv(verifyChildEnv) == "walk" {
		os.Exit(walkInBbolt(os.Args[len(os.Args)-1]))
	}
	if os.Getenv(verifyChildEnv) == "1" {
		os.Exit(RunVerify(os.Args[len(os.Args)-1], slices.Contains(os.Args, "--status-only"), childCeiling(), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// childCeiling is the memory ceiling VerifyCommand passed the test
// binary, as a child.
func childCeiling() int64 {
	for _, a := range os.Args {
		if v, ok := strings.CutPrefix(a, "--"+MemoryCeilingFlag+"="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				panic(err)
			}
			return n
		}
	}
	return 0
}

func TestVerifyRefusesBadSnapshots(t *testing.T) {
	dir := t.TempDir()
	body := []byte(strings.Repeat("x", 4096))
	sum := sha256.Sum256(body)
	cases := map[string][]byte{
		"short":       []byte("tiny"),
		"bad-trailer": append(append([]byte{}, body...), make([]byte, sha256.Size)...),
		// The trailer matches, but the body is no bbolt database.
		"not-a-db": append(append([]byte{}, body...), sum[:]...),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Verify(p); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Verify = %v, want ErrCorrupt", err)
			}
			// The same verdict through a child process, as the agent verifies.
			t.Setenv(verifyChildEnv, "1")
			_, err := VerifyCommand(os.Args[0])(t.Context(), p)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) {
				t.Errorf("VerifyCommand = %v, want ErrCorrupt naming %s", err, p)
			}
		})
	}
}

// A snapshot whose trailer matches but whose pages are damaged, as a
// damaged member's would be, is corrupt whichever way the child finds
// out: bbolt's check recovers a panic in its own walk and reports it, but
// bbolt can also panic where no recover reaches (in a goroutine of its
// own as it opens the file, and which comes first is a race), and the
// Go runtime ends the child. Neither is a check that could not run
// (which a restore would retry and a drill would not count).
func TestVerifyCommandDamagedPagesAreCorrupt(t *testing.T) {
	p := damagedSnapshot(t)
	t.Setenv(verifyChildEnv, "1")
	for _, args := range [][]string{nil, {"--status-only"}} {
		_, err := VerifyCommand(os.Args[0], args...)(t.Context(), p)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) {
			t.Errorf("VerifyCommand %v of a snapshot with damaged pages: %v, want ErrCorrupt naming it", args, err)
		}
	}
}

// A child that crashes inside bbolt on the snapshot's pages found it
// corrupt: the child here walks the damaged file's keys with no recover
// on the way, so it crashes every time.
func TestVerifyCommandCrashIsCorrupt(t *testing.T) {
	p := damagedSnapshot(t)
	t.Setenv(verifyChildEnv, "walk")
	_, err := VerifyCommand(os.Args[0])(t.Context(), p)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "crashed bbolt") {
		t.Errorf("VerifyCommand of a child that crashed in bbolt: %v, want ErrCorrupt for bbolt's crash", err)
	}
}

// A snapshot with one page header changed (a leaf claiming 2^28
// overflow pages) sends bbolt's check into a walk that takes memory
// without end: 800 MB in 5 s with no ceiling. The child is stopped at
// its ceiling, well within 30 s, and the snapshot fails its check.
func TestVerifyCeilingStopsARunawayCheck(t *testing.T) {
	p := filepath.Join(t.TempDir(), "snapshot.db")
	writeSnapshotDB(t, p, 3000)
	body, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	leaf := 0
	for off := 2 * page; off+page <= len(body); off += page {
		if binary.LittleEndian.Uint64(body[off:]) == uint64(off/page) && binary.LittleEndian.Uint16(body[off+8:]) == 0x02 && binary.LittleEndian.Uint16(body[off+10:]) > 1 {
			leaf = off // the last one
		}
	}
	if leaf == 0 {
		t.Fatal("the snapshot has no leaf page to damage")
	}
	binary.LittleEndian.PutUint32(body[leaf+12:], 1<<28) // the page's overflow count
	sum := sha256.Sum256(body)
	if err := os.WriteFile(p, append(body, sum[:]...), 0o600); err != nil {
		t.Fatal(err)
	}
	ceiling := CeilingFor(int64(len(body) + sha256.Size))
	t.Setenv(verifyChildEnv, "1")

	// The child as VerifyCommand runs it, to read its peak memory.
	cmd := exec.CommandContext(t.Context(), os.Args[0], "--status-only", fmt.Sprintf("--%s=%d", MemoryCeilingFlag, ceiling.Memory), p)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitCeiling {
		t.Fatalf("child: %v after %s, %q; want exit %d at its ceiling", err, took, stderr.String(), exitCeiling)
	}
	peak := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB
	// The watch looks every 10 ms; what the check takes meanwhile, and
	// the binary's own pages, are the slack.
	if limit := ceiling.Memory + 64<<20; peak > limit || took > 30*time.Second {
		t.Errorf("child peaked at %d bytes in %s; want at most %d within 30 s", peak, took, limit)
	}
	t.Logf("stopped at its ceiling of %d bytes after %s, peak %d bytes", ceiling.Memory, took, peak)

	for _, args := range [][]string{nil, {"--status-only"}} {
		_, err := VerifyCommand(os.Args[0], args...)(t.Context(), p)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) {
			t.Errorf("VerifyCommand %v: %v, want ErrCorrupt naming %s", args, err, p)
		}
	}
}

// hog is a child that takes memory as fast as it can, past any watch:
// 16 MiB at a time, every page touched, up to 2 GiB or 30 s. It exits 0
// if nothing stops it.
func hog() int {
	var held [][]byte
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < 128 && time.Now().Before(deadline); i++ {
		b := make([]byte, 16<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		held = append(held, b)
	}
	runtime.KeepAlive(held)
	return 0
}

// Where this process may make a memory cgroup (root, cgroup v1's memory
// controller: this project's machines), each verify child runs in one
// limited to its ceiling and a margin: a child that takes memory faster
// than any watch of its own is stopped by the kernel near that limit,
// reported as failing its check, and its cgroup is removed.
func TestVerifyMemoryCgroup(t *testing.T) {
	probe, err := newMemCgroup(64 << 20)
	if err != nil {
		t.Fatalf("no memory cgroup can be made here (%v): this test needs root and a memory controller, as the project's machines have", err)
	}
	parent := filepath.Dir(probe.dir)
	probe.remove()
	// One left by an agent that is gone is removed by the next.
	stale := filepath.Join(parent, cgroupPrefix+"2147483646-1")
	if err := os.Mkdir(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(stale) })
	p := filepath.Join(t.TempDir(), "snapshot.db")
	writeSnapshotDB(t, p, 10)
	t.Setenv(verifyChildEnv, "hog")
	ceiling := func(int64) Ceiling { return Ceiling{Memory: 64 << 20, Timeout: time.Minute} }
	start := time.Now()
	_, err = verifyCommand(os.Args[0], ceiling)(t.Context(), p)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "its memory cgroup stopped it") {
		t.Fatalf("a child taking 2 GiB under a 64 MiB ceiling: %v after %s, want ErrCorrupt from its memory cgroup", err, time.Since(start))
	}
	t.Logf("stopped by its cgroup after %s: %v", time.Since(start).Round(time.Millisecond), err)
	left, _ := filepath.Glob(filepath.Join(parent, fmt.Sprintf("etcd-manager-verify-%d-*", os.Getpid())))
	if len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cgroup of a gone agent stays: %v", err)
	}
	// A sound check in a cgroup passes.
	t.Setenv(verifyChildEnv, "1")
	if _, err := VerifyCommand(os.Args[0], "--status-only")(t.Context(), p); err != nil {
		t.Errorf("a sound snapshot in a cgroup: %v", err)
	}
}

// A check that runs past its time limit fails, and the child is stopped.
func TestVerifyTimeLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "snapshot.db")
	writeSnapshotDB(t, p, 10)
	t.Setenv(verifyChildEnv, "sleep")
	limit := func(int64) Ceiling { return Ceiling{Memory: 256 << 20, Timeout: 200 * time.Millisecond} }
	start := time.Now()
	_, err := verifyCommand(os.Args[0], limit)(t.Context(), p)
	if !errors.Is(err, ErrCheckLimit) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "ran past its limit of 200ms") || time.Since(start) > 10*time.Second {
		t.Errorf("verify of a child that sleeps: %v after %s, want ErrCheckLimit at its time limit", err, time.Since(start))
	}
	// A caller's own cancellation is not the snapshot's failing.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := VerifyCommand(os.Args[0])(ctx, p); err == nil || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrCheckLimit) {
		t.Errorf("verify cancelled by its caller: %v, want an error that is neither ErrCorrupt nor ErrCheckLimit", err)
	}
}

// CeilingFor grows with the snapshot, from a floor.
func TestCeilingFor(t *testing.T) {
	tests := []struct {
		size    int64
		memory  int64
		timeout time.Duration
	}{
		{0, 256 << 20, 2 * time.Minute},
		{-1, 256 << 20, 2 * time.Minute},
		{512 << 10, 256<<20 + 64<<10, 2 * time.Minute},
		{8 << 30, 256<<20 + 1<<30, 2*time.Minute + 512*time.Second},
	}
	for _, tt := range tests {
		if got := CeilingFor(tt.size); got.Memory != tt.memory || got.Timeout != tt.timeout {
			t.Errorf("CeilingFor(%d) = %+v, want %d bytes, %s", tt.size, got, tt.memory, tt.timeout)
		}
	}
}

// damagedSnapshot writes a snapshot whose sha256 trailer matches but whose
// pages from the fifth on are garbage; the two meta pages and the two
// after them are whole.
func damagedSnapshot(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "snapshot.db")
	writeSnapshotDB(t, p, 3000)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	page := int64(os.Getpagesize()) // bbolt's page size by default
	junk := make([]byte, st.Size()-4*page)
	for i := range junk {
		junk[i] = byte(i*7 + 3)
	}
	if _, err := f.WriteAt(junk, 4*page); err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	if _, err := f.WriteAt(sum[:], int64(len(body))); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// walkInBbolt is the crashing child of TestVerifyCommandCrashIsCorrupt:
// it reads every key of the database at path with no recover, and
// returns only if that succeeds, which on a damaged file it does not.
func walkInBbolt(path string) int {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			return b.ForEach(func(_, _ []byte) error { return nil })
		})
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// writeSnapshotDB writes a bbolt database at path as etcd's snapshot
// would hold n keys: the buckets etcdutl's status reads, each key under
// its revision.
func writeSnapshotDB(t *testing.T, path string, n int) {
	t.Helper()
	// Like etcd's backend, without a freelist on disk: whoever opens
	// the file walks every page to find the free ones.
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("meta")); err != nil { // etcdutl's status reads it
			return err
		}
		b, err := tx.CreateBucket([]byte("key"))
		if err != nil {
			return err
		}
		for i := range n {
			// A revision key (main i+2, sub 0), as etcd's mvcc writes it.
			rev := binary.BigEndian.AppendUint64(nil, uint64(i+2))
			rev = binary.BigEndian.AppendUint64(append(rev, '_'), 0)
			kv, err := proto.Marshal(&mvccpb.KeyValue{Key: []byte(fmt.Sprintf("k%06d", i)), Value: []byte("v"), CreateRevision: int64(i + 2), ModRevision: int64(i + 2), Version: 1})
			if err != nil {
				return err
			}
			if err := b.Put(rev, kv); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// A snapshot with a value etcd cannot read is corrupt, and says so in a
// bounded message: etcdutl quotes the whole value it failed on.
func TestStatusErrorIsBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "snapshot.db")
	db, err := bolt.Open(p, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("meta")); err != nil {
			return err
		}
		b, err := tx.CreateBucket([]byte("key"))
		if err != nil {
			return err
		}
		rev := binary.BigEndian.AppendUint64(nil, 2)
		rev = binary.BigEndian.AppendUint64(append(rev, '_'), 0)
		return b.Put(rev, bytes.Repeat([]byte{0xff}, 512<<10)) // no KeyValue
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for name, check := range map[string]func(string) (snapshot.Status, error){"ReadStatus": ReadStatus, "status": status} {
		_, err := check(p)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: got %v, want ErrCorrupt", name, err)
		}
		if n := len(err.Error()); n > maxStatusError+len(p)+100 {
			t.Errorf("%s: the error is %d bytes long", name, n)
		}
		if !strings.Contains(err.Error(), "cannot unmarshal") {
			t.Errorf("%s: the error lost etcdutl's reason: %.300s", name, err)
		}
	}
}

// A status-only check reads the database and leaves the trailer alone:
// the backup checked it as the snapshot streamed in.
func TestStatusOnlyLeavesTheTrailer(t *testing.T) {
	p := filepath.Join(t.TempDir(), "snapshot.db")
	writeSnapshotDB(t, p, 1)
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, sha256.Size)); err != nil { // a wrong trailer
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Setenv(verifyChildEnv, "1")
	if _, err := VerifyCommand(os.Args[0])(t.Context(), p); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "trailer") {
		t.Fatalf("a full check of a snapshot with a wrong trailer: %v, want ErrCorrupt for the trailer", err)
	}
	st, err := VerifyCommand(os.Args[0], "--status-only")(t.Context(), p)
	if err != nil {
		t.Fatalf("a status-only check: %v", err)
	}
	if st.TotalKey != 1 {
		t.Fatalf("status %+v, want the 1 key written", st)
	}
	if _, err := ReadStatus(filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Fatal("ReadStatus of a missing file succeeded")
	}
}

func TestNamesAndListing(t *testing.T) {
	s, err := store.Open(t.Context(), "file://"+filepath.Join(t.TempDir(), "s"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	now := time.Date(2026, 11, 22, 3, 4, 5, 0, time.UTC)
	first, err := claimName(ctx, s, now)
	if err != nil || first != "2026-11-22T03:04:05Z-000001" {
		t.Fatalf("first name %q, %v", first, err)
	}
	for _, k := range []string{first + "/" + DataObject, first + "/" + MetaObject} {
		if err := s.Write(ctx, k, []byte(`{"etcdVersion":"3.6.16","timestamp":"1795316645"}`)); err != nil {
			t.Fatal(err)
		}
	}
	second, _ := claimName(ctx, s, now)
	if second != "2026-11-22T03:04:05Z-000002" {
		t.Errorf("second name in the same second = %q", second)
	}
	// Data without meta, junk meta and foreign folders are not backups.
	for k, v := range map[string]string{
		second + "/" + DataObject:                   "partial",
		"2026-11-22T03:04:06Z-000001/" + MetaObject: "{junk",
		"control/etcd-cluster-spec":                 "{}",
	} {
		if err := s.Write(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := List(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Name != first || infos[0].Meta.EtcdVersion != "3.6.16" || infos[0].Meta.Timestamp != 1795316645 {
		t.Errorf("List = %+v", infos)
	}
	// Newest reads newest first and passes over the same; it stops at
	// maxReads, and takes only what match accepts.
	for _, tt := range []struct {
		name string
		want Want
		got  string
	}{
		{"any", Want{}, first},
		{"past the junk and the unfinished one", Want{MaxReads: 3}, first},
		{"only those two read", Want{MaxReads: 2}, ""},
		{"none matches", Want{Token: "other"}, ""},
		{"dated before the backup", Want{NotAfter: now.Add(-time.Second)}, ""},
		{"dated at it", Want{NotAfter: now}, first},
	} {
		in, err := Newest(ctx, s, tt.want)
		if err != nil || (in == nil) != (tt.got == "") || (in != nil && in.Name != tt.got) {
			t.Errorf("Newest, %s: %+v, %v; want %q", tt.name, in, err, tt.got)
		}
	}
	// Backups dated in the future, by name or by meta, are the newest
	// only to a reader that takes any date.
	for k, v := range map[string]string{
		"2099-01-01T00:00:00Z-000001/" + MetaObject: `{"etcdVersion":"3.6.16","timestamp":"1795316645"}`,
		"2026-11-22T03:04:07Z-000001/" + MetaObject: `{"etcdVersion":"3.6.16","timestamp":"4070908800"}`,
	} {
		if err := s.Write(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if in, err := Newest(ctx, s, Want{}); err != nil || in == nil || in.Name != "2099-01-01T00:00:00Z-000001" {
		t.Errorf("Newest of any date: %+v, %v", in, err)
	}
	if in, err := Newest(ctx, s, Want{NotAfter: now.Add(spec.FutureSkew)}); err != nil || in == nil || in.Name != first {
		t.Errorf("Newest up to now: %+v, %v; want %s", in, err, first)
	}
}

// Writers racing in the same second, as two leaders would, never share a
// backup name.
func TestClaimNameRace(t *testing.T) {
	s, err := store.Open(t.Context(), "file://"+filepath.Join(t.TempDir(), "s"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 11, 22, 3, 4, 5, 0, time.UTC)
	const writers = 8
	names := make([]string, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name, err := claimName(t.Context(), s, now)
			if err != nil {
				t.Error(err)
			}
			names[i] = name
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] || !strings.HasPrefix(n, "2026-11-22T03:04:05Z-") {
			t.Fatalf("names %q: want distinct names in the same second", names)
		}
		seen[n] = true
	}
}

// The trailer is checked as the stream passes, whatever the chunks it
// comes in; a changed byte, a cut stream or a stream of no page size
// fails.
func TestTrailerHash(t *testing.T) {
	body := make([]byte, 3*512)
	for i := range body {
		body[i] = byte(i * 7)
	}
	sum := sha256.Sum256(body)
	good := append(append([]byte(nil), body...), sum[:]...)
	flipped := append([]byte(nil), good...)
	flipped[100] ^= 1
	badTrailer := append([]byte(nil), good...)
	badTrailer[len(badTrailer)-1] ^= 1
	for _, c := range []struct {
		name   string
		stream []byte
		ok     bool
	}{
		{"whole", good, true},
		{"a byte changed", flipped, false},
		{"the trailer changed", badTrailer, false},
		{"cut short", good[:len(good)-1], false},
		{"no trailer", body, false},
		{"too short", good[len(good)-40:], false},
	} {
		for _, chunk := range []int{1, 7, 31, 32, 33, 500, 4096} {
			tr := &trailerHash{h: sha256.New()}
			for p := c.stream; len(p) > 0; {
				n := min(chunk, len(p))
				tr.Write(p[:n])
				p = p[n:]
			}
			if err := tr.check(); (err == nil) != c.ok {
				t.Errorf("%s in chunks of %d: check() = %v, want ok=%v", c.name, chunk, err, c.ok)
			}
			if tr.n != int64(len(c.stream)) {
				t.Errorf("%s: counted %d bytes, want %d", c.name, tr.n, len(c.stream))
			}
		}
	}
}

// A child's messages are kept up to the cap, and the rest is taken
// without error, even through io.Copy.
func TestCappedKeepsTheFirstBytes(t *testing.T) {
	c := &capped{max: 10}
	if n, err := io.Copy(c, strings.NewReader(strings.Repeat("x", 100))); n != 100 || err != nil {
		t.Fatalf("io.Copy: %d, %v", n, err)
	}
	if got := c.String(); got != strings.Repeat("x", 10) {
		t.Errorf("kept %q", got)
	}
}
