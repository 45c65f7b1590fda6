package etcdproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/schema"

	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// dumpDB reads every bucket's keys and values.
func dumpDB(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			kv := map[string]string{}
			out[string(name)] = kv
			return b.ForEach(func(k, v []byte) error {
				kv[string(k)] = string(v)
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompactDB: a database with most of its keys deleted shrinks, keeps
// every bucket, key and value, passes the start-up check, and a copy left
// by an earlier crash is replaced, not kept.
func TestCompactDB(t *testing.T) {
	dir := t.TempDir()
	path := writeDB(t, dir, 20000, 4)
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Key.Name())
		c := b.Cursor()
		i := 0
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if i%5 != 4 {
				if err := c.Delete(); err != nil {
					return err
				}
			}
			i++
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	want := dumpDB(t, path)
	stale := filepath.Join(filepath.Dir(path), compactTempName)
	if err := os.WriteFile(stale, []byte("left by a crash"), 0o600); err != nil {
		t.Fatal(err)
	}

	// 64 KiB per transaction: dozens of commits for this file.
	res, err := CompactDB(context.Background(), dir, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if res.SizeAfter <= 0 || res.SizeAfter > res.SizeBefore/2 {
		t.Errorf("compacted from %d to %d bytes; want under half, with four fifths of the keys deleted", res.SizeBefore, res.SizeAfter)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != res.SizeAfter {
		t.Errorf("the database is %v (%v), the result says %d bytes", st, err, res.SizeAfter)
	}
	got := dumpDB(t, path)
	if len(got) != len(want) {
		t.Fatalf("%d buckets after compaction, want %d", len(got), len(want))
	}
	for name, kv := range want {
		if len(got[name]) != len(kv) {
			t.Errorf("bucket %q holds %d keys after compaction, want %d", name, len(got[name]), len(kv))
		}
		for k, v := range kv {
			if got[name][k] != v {
				t.Errorf("bucket %q key %x changed in compaction", name, k)
				break
			}
		}
	}
	if len(want[string(schema.Key.Name())]) != 4000 {
		t.Errorf("the key bucket held %d keys before compaction, want 4000", len(want[string(schema.Key.Name())]))
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy is still beside the database: %v", err)
	}
	if _, err := CheckData(context.Background(), dir); err != nil {
		t.Errorf("the compacted database fails the start-up check: %v", err)
	}
	if rev, err := ReadRevision(dir); err != nil || rev != 20000 {
		t.Errorf("revision %d (%v) after compaction, want 20000", rev, err)
	}
}

// TestCompactDBLeavesTheDatabaseOnFailure: a damaged database, or a
// caller that gave up, leaves the file byte for byte as it was and no
// copy beside it.
func TestCompactDBLeavesTheDatabaseOnFailure(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		damage  bool
		wantErr error
	}{
		{name: "damaged page headers", ctx: context.Background(), damage: true, wantErr: ErrDamagedData},
		{name: "cancelled", ctx: cancelled, wantErr: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeDB(t, dir, 2000, 0)
			if tc.damage {
				damagePageHeaders(t, path)
			}
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = CompactDB(tc.ctx, dir, 4<<10)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("CompactDB: %v, want %v", err, tc.wantErr)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Error("the database changed")
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), compactTempName)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a copy is left beside the database: %v", err)
			}
		})
	}
}

// TestCompactDBCommand: the copy in a child process compacts as in
// process; a damaged database is ErrDamagedData; and a copy stopped
// midway (paused before its rename, then its context cancelled) is killed
// and deleted, and leaves the database byte for byte as it was.
func TestCompactDBCommand(t *testing.T) {
	t.Setenv(compactChild, "1")
	compact := CompactDBCommand(os.Args[0], "-test.run=^$")
	copyPath := func(dir string) string { return filepath.Join(filepath.Dir(DBPath(dir)), compactTempName) }

	t.Run("compacts", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 3000, 0)
		want := dumpDB(t, path)
		res, err := compact(t.Context(), dir)
		if err != nil {
			t.Fatal(err)
		}
		if res.SizeBefore <= 0 || res.SizeAfter <= 0 || res.Took <= 0 {
			t.Errorf("result %+v: want both sizes and the time taken", res)
		}
		if st, err := os.Stat(path); err != nil || st.Size() != res.SizeAfter {
			t.Errorf("the database is %v (%v), the result says %d bytes", st, err, res.SizeAfter)
		}
		got := dumpDB(t, path)
		if len(got[string(schema.Key.Name())]) != len(want[string(schema.Key.Name())]) || len(want[string(schema.Key.Name())]) != 3000 {
			t.Errorf("%d keys after the copy, %d before; want 3000", len(got[string(schema.Key.Name())]), len(want[string(schema.Key.Name())]))
		}
	})

	t.Run("damaged", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 2000, 0)
		damagePageHeaders(t, path)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = compact(t.Context(), dir)
		t.Logf("compact: %v", err)
		if !errors.Is(err, ErrDamagedData) {
			t.Fatalf("compact of a damaged database: %v, want ErrDamagedData", err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Error("the damaged database changed")
		}
		if _, err := os.Stat(copyPath(dir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a copy is left beside the database: %v", err)
		}
	})

	t.Run("stopped midway", func(t *testing.T) {
		needHooks(t)
		dir := t.TempDir()
		path := writeDB(t, dir, 2000, 0)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		claim := filepath.Join(t.TempDir(), "claim")
		t.Setenv(testhook.PauseEnv, CompactPausePoint+"@"+claim)
		ctx, cancel := context.WithCancelCause(t.Context())
		stopped := errors.New("the cluster degraded")
		errc := make(chan error, 1)
		go func() {
			_, err := compact(ctx, dir)
			errc <- err
		}()
		// The child pauses itself once its copy is written.
		deadline := time.Now().Add(time.Minute)
		for {
			b, err := os.ReadFile(claim)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil && pid > 0 && childStopped(pid) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the child did not pause before its rename within a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := os.Stat(copyPath(dir)); err != nil {
			t.Fatalf("no copy beside the database while the child is paused: %v", err)
		}
		cancel(stopped)
		select {
		case err = <-errc:
		case <-time.After(time.Minute):
			t.Fatal("the stopped copy did not return within a minute")
		}
		if !errors.Is(err, stopped) || errors.Is(err, ErrDamagedData) {
			t.Fatalf("compact stopped midway: %v, want the cause it was stopped for", err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Error("the database changed")
		}
		if _, err := os.Stat(copyPath(dir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the stopped copy is left beside the database: %v", err)
		}
	})
}

// TestCompactDBOutlivesNoAgent: a copy whose agent dies is killed with
// it, before its rename, and one that finds its parent gone before the
// rename leaves the database as it was. A copy renamed over the database
// after a new agent started etcd on it would take etcd's newer writes
// away at its next start.
func TestCompactDBOutlivesNoAgent(t *testing.T) {
	t.Run("killed with its agent", func(t *testing.T) {
		needHooks(t)
		dir := t.TempDir()
		path := writeDB(t, dir, 2000, 0)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		claim := filepath.Join(t.TempDir(), "claim")
		agent := exec.Command(os.Args[0], "-test.run=^$", dir)
		agent.Env = append(os.Environ(), compactParent+"=1", testhook.PauseEnv+"="+CompactPausePoint+"@"+claim)
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		defer agent.Process.Kill()
		var child int
		deadline := time.Now().Add(time.Minute)
		for {
			b, err := os.ReadFile(claim)
			child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil && child > 0 && childStopped(child) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the copy did not pause before its rename within a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := agent.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = agent.Wait()
		deadline = time.Now().Add(30 * time.Second)
		for childAlive(child) {
			if time.Now().After(deadline) {
				syscall.Kill(child, syscall.SIGKILL)
				t.Fatalf("the copy %d still lives 30s after its agent was killed", child)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Error("the database changed")
		}
	})

	t.Run("its parent gone before the rename", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 2000, 0)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		gone := errors.New("the agent is gone")
		if _, err := compactDB(t.Context(), dir, 0, func() error { return gone }); !errors.Is(err, gone) {
			t.Fatalf("compact: %v, want %v", err, gone)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Error("the database changed")
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), compactTempName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a copy is left beside the database: %v", err)
		}
	})
}

// childAlive reports whether process pid exists and is not a zombie.
func childAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// childStopped reports whether process pid is stopped (SIGSTOP).
func childStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

// TestCrashedOnData: a child's exit counts as damage found only when the
// Go runtime ended it on a panic or a fault, and not for lack of memory.
func TestCrashedOnData(t *testing.T) {
	exitWith := func(code int) *exec.ExitError {
		err := exec.Command("sh", "-c", fmt.Sprintf("exit %d", code)).Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("sh exit %d: %v", code, err)
		}
		return exit
	}
	two, one := exitWith(2), exitWith(1)
	for _, tc := range []struct {
		exit *exec.ExitError
		msg  string
		want bool
	}{
		{two, "panic: assertion failed: page 258: has unexpected type/flags: 7777\n\ngoroutine 7 [running]:\ngo.etcd.io/bbolt.(*Tx).checkBucket(...)", true},
		{two, "unexpected fault address 0x7f0000001000\nfatal error: fault\n\ngoroutine 1 [running]:\ngo.etcd.io/bbolt.(*Cursor).search(...)", true},
		{two, "fatal error: fault\n\ngoroutine 1 [running]:\ngo.etcd.io/bbolt.(*Bucket).pageNode(...)", true},
		// The child printed what one of bbolt's goroutines found, then
		// another crashed on the same page before the child could exit.
		{two, "etcdproc: etcd's database is damaged: /d/member/snap/db: bbolt's consistency check: panic: assertion failed: Page expected to be: 258, but self identifies as 0\npanic: assertion failed: Page expected to be: 258, but self identifies as 0\n\ngoroutine 54 [running]:\ngo.etcd.io/bbolt/internal/common.(*Page).FastCheck(...)", true},
		{one, "etcdproc: etcd's database is damaged: /d/member/snap/db: bbolt's consistency check: page 3: unreachable unfreed\npanic: assertion failed\ngo.etcd.io/bbolt.(*Tx).checkBucket(...)", false},
		{two, "fatal error: runtime: out of memory\n\ngoroutine 1 [running]:\ngo.etcd.io/bbolt.(*DB).mmap(...)", false},
		{two, "panic: runtime error: index out of range\n\ngoroutine 1 [running]:\nmain.main()", false},
		{two, "flag provided but not defined: -x", false},
		{one, "panic: assertion failed\ngo.etcd.io/bbolt.(*Tx).checkBucket(...)", false},
	} {
		if got := crashedOnData(tc.exit, tc.msg); got != tc.want {
			t.Errorf("exit %d with %q: crashedOnData = %v, want %v", tc.exit.ExitCode(), tc.msg, got, tc.want)
		}
	}
}

// needHooks fails a test that pauses the copy at its test hook in a test
// binary built without them: make test builds with -tags testhooks.
func needHooks(t *testing.T) {
	t.Helper()
	if !testhook.Enabled {
		t.Fatal("this test pauses the copy at a test hook: build it with -tags testhooks (make test and make unit do)")
	}
}
