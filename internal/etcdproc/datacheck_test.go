package etcdproc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
)

// checkDataChild is set in the environment of this test binary run as a
// CheckDataCommand child.
const checkDataChild = "ETCDPROC_TEST_CHECK_DATA_CHILD"

// compactChild is set in the environment of this test binary run as a
// CompactDBCommand child.
const compactChild = "ETCDPROC_TEST_COMPACT_CHILD"

// compactParent is set in the environment of this test binary run as
// the agent that starts a CompactDBCommand child.
const compactParent = "ETCDPROC_TEST_COMPACT_PARENT"

func TestMain(m *testing.M) {
	if os.Getenv(checkDataChild) != "" {
		os.Exit(RunCheckData(context.Background(), os.Args[len(os.Args)-1], os.Stdout, os.Stderr))
	}
	if os.Getenv(compactChild) != "" {
		os.Exit(RunCompactDB(context.Background(), os.Args[len(os.Args)-1], os.Stdout, os.Stderr))
	}
	if os.Getenv(compactParent) != "" {
		// An agent's stand-in: it starts a copy as the agent does.
		os.Setenv(compactChild, "1")
		_, err := CompactDBCommand(os.Args[0], "-test.run=^$")(context.Background(), os.Args[len(os.Args)-1])
		fmt.Println(err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// writeDB writes a bbolt file laid out as etcd's (no freelist on disk):
// revs revisions in the key bucket, and finishedCompactRev compacted in
// the meta bucket when it is set.
func writeDB(t *testing.T, dataDir string, revs int, compacted int64) string {
	t.Helper()
	path := DBPath(dataDir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		kb, err := tx.CreateBucket(schema.Key.Name())
		if err != nil {
			return err
		}
		val := []byte(strings.Repeat("v", 200))
		for i := 1; i <= revs; i++ {
			k := mvcc.RevToBytes(mvcc.Revision{Main: int64(i)}, make([]byte, 17))
			if err := kb.Put(k, val); err != nil {
				return err
			}
		}
		mb, err := tx.CreateBucket(schema.Meta.Name())
		if err != nil || compacted == 0 {
			return err
		}
		return mb.Put(schema.FinishedCompactKeyName, mvcc.RevToBytes(mvcc.Revision{Main: compacted}, make([]byte, 17)))
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// damagePageHeaders overwrites the type flags of every leaf page with a
// value bbolt knows no page by.
func damagePageHeaders(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	const pageSize = 4096 // bbolt's page size on this platform's default
	if os.Getpagesize() != pageSize {
		t.Fatalf("the page size is %d, not %d", os.Getpagesize(), pageSize)
	}
	bad := make([]byte, 2)
	binary.LittleEndian.PutUint16(bad, 0x7777)
	flags := make([]byte, 2)
	damaged := 0
	for off := int64(2 * pageSize); off < st.Size(); off += pageSize {
		// page header: id uint64, flags uint16, count uint16, overflow uint32
		if _, err := f.ReadAt(flags, off+8); err != nil {
			t.Fatal(err)
		}
		if binary.LittleEndian.Uint16(flags) != 0x02 { // a leaf page
			continue
		}
		if _, err := f.WriteAt(bad, off+8); err != nil {
			t.Fatal(err)
		}
		damaged++
	}
	if damaged == 0 {
		t.Fatal("no leaf page to damage")
	}
}

func TestCheckData(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(t *testing.T, dataDir string)
		wantRev  int64
		wantErr  error
		errMatch string
	}{
		{name: "consistent", setup: func(t *testing.T, d string) { writeDB(t, d, 500, 0) }, wantRev: 500},
		{name: "compacted past the last key", setup: func(t *testing.T, d string) { writeDB(t, d, 20, 35) }, wantRev: 35},
		{name: "missing", setup: func(t *testing.T, d string) {}, wantErr: ErrDamagedData, errMatch: "missing"},
		{name: "empty", setup: func(t *testing.T, d string) {
			p := DBPath(d)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, wantErr: ErrDamagedData, errMatch: "empty"},
		{name: "page headers damaged", setup: func(t *testing.T, d string) {
			damagePageHeaders(t, writeDB(t, d, 500, 0))
		}, wantErr: ErrDamagedData},
		{name: "truncated", setup: func(t *testing.T, d string) {
			p := writeDB(t, d, 2000, 0)
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()/3); err != nil {
				t.Fatal(err)
			}
		}, wantErr: ErrDamagedData},
		{name: "meta pages zeroed", setup: func(t *testing.T, d string) {
			p := writeDB(t, d, 10, 0)
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, 2*4096), 0); err != nil {
				t.Fatal(err)
			}
		}, wantErr: ErrDamagedData},
	}
	// In a child, as the agent checks: bbolt panics on some damage in
	// goroutines of its own.
	t.Setenv(checkDataChild, "1")
	check := CheckDataCommand(os.Args[0], "-test.run=^$")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			tt.setup(t, d)
			got, err := check(t.Context(), d)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("CheckData: %v", err)
				}
				if got.Revision != tt.wantRev || got.Size == 0 {
					t.Errorf("CheckData = %+v, want revision %d and a size", got, tt.wantRev)
				}
				return
			}
			t.Logf("CheckData: %v", err)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("CheckData: %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.errMatch) {
				t.Errorf("CheckData: %v, want it to say %q", err, tt.errMatch)
			}
		})
	}
}

// A child that cannot run is no proof of damage.
func TestCheckDataCommandFails(t *testing.T) {
	d := t.TempDir()
	writeDB(t, d, 5, 0)
	_, err := CheckDataCommand(filepath.Join(t.TempDir(), "missing"))(t.Context(), d)
	if err == nil || errors.Is(err, ErrDamagedData) {
		t.Fatalf("check with a missing child: %v, want an error that is not ErrDamagedData", err)
	}
}

// An open database (a running etcd holds its lock) is not called damaged.
func TestCheckDataLocked(t *testing.T) {
	d := t.TempDir()
	path := writeDB(t, d, 5, 0)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = CheckData(t.Context(), d)
	if err == nil || errors.Is(err, ErrDamagedData) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("CheckData on a locked file: %v, want a lock error that is not ErrDamagedData", err)
	}
}

// The hook runs before a start on data etcd ran on after an unclean exit
// (a pid file left behind, or etcd's exit by itself), never after a
// clean stop or for a member without data yet.
func TestSupervisorChecksAfterUncleanExit(t *testing.T) {
	dir := t.TempDir()
	etcd := filepath.Join(dir, "etcd-v3.6.16", "etcd")
	writeScript(t, etcd, "exec sleep 60")
	dataDir := filepath.Join(dir, "data", "tok")
	if err := os.MkdirAll(filepath.Join(dataDir, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "etcd.pid")
	var checks atomic.Int32
	refuse := atomic.Bool{}
	sup := NewSupervisor(SupervisorConfig{
		PIDFile: pidFile, Output: io.Discard, StopTimeout: 2 * time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		AfterUncleanExit: func(_ context.Context, sp Spec) error {
			checks.Add(1)
			if refuse.Load() {
				return errors.New("refused")
			}
			return nil
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	sp := Spec{Binaries: Binaries{Etcd: etcd}, Name: "n", DataDir: dataDir, RequireData: true}

	// A clean first start: no pid file.
	if err := sup.Start(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "etcd to run", func() bool { return sup.Status().PID != 0 })
	if n := checks.Load(); n != 0 {
		t.Fatalf("%d checks before a clean start, want 0", n)
	}
	// etcd dies by itself: checked before the restart.
	first := sup.Status().PID
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "restart", func() bool { st := sup.Status(); return st.PID != 0 && st.PID != first })
	if n := checks.Load(); n != 1 {
		t.Fatalf("%d checks after etcd died, want 1", n)
	}
	// A clean stop and start: no check.
	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := sup.Start(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	if n := checks.Load(); n != 1 {
		t.Fatalf("%d checks after a clean stop, want still 1", n)
	}
	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A pid file left behind (the agent died with etcd): checked, and a
	// refusal fails the start and keeps etcd down.
	if err := os.WriteFile(pidFile, []byte("999999999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	refuse.Store(true)
	if err := sup.Start(t.Context(), sp); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("start after a refused check: %v, want the refusal", err)
	}
	if st := sup.Status(); st.PID != 0 {
		t.Fatalf("etcd runs (pid %d) though its check refused it", st.PID)
	}
	refuse.Store(false)
	waitFor(t, "a retried start once the check passes", func() bool { return sup.Status().PID != 0 })
	if n := checks.Load(); n < 3 {
		t.Errorf("%d checks, want at least 3", n)
	}
	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// ReadRevision reads the head revision in this process; damage is an
// error, never a crash.
func TestReadRevision(t *testing.T) {
	d := t.TempDir()
	writeDB(t, d, 300, 0)
	if rev, err := ReadRevision(d); err != nil || rev != 300 {
		t.Fatalf("ReadRevision = %d, %v; want 300", rev, err)
	}
	damagePageHeaders(t, DBPath(d))
	if rev, err := ReadRevision(d); !errors.Is(err, ErrDamagedData) {
		t.Fatalf("ReadRevision of damaged pages = %d, %v; want ErrDamagedData", rev, err)
	}
	if _, err := ReadRevision(t.TempDir()); err == nil {
		t.Fatal("ReadRevision of a missing database: no error")
	}
}
