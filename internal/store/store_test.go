package store

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"gocloud.dev/blob"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	s, err := Open(t.Context(), "file://"+dir, Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func TestSpecRoundTripAndLayout(t *testing.T) {
	s, dir := openTemp(t)
	ctx := t.Context()
	if _, err := s.ReadSpec(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadSpec on empty store: %v, want ErrNotFound", err)
	}
	want := spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}
	if err := s.WriteSpec(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadSpec(ctx)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadSpec = %+v, %v", got, err)
	}
	// The object sits at the format's path, as plain JSON, with no sidecar
	// files beside it.
	raw, err := os.ReadFile(filepath.Join(dir, "control", "etcd-cluster-spec"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(raw)) != `{"memberCount":3,"etcdVersion":"3.6.16"}` {
		t.Errorf("stored spec = %s", raw)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "control"))
	if len(entries) != 1 {
		t.Errorf("control/ holds %d entries, want only the spec: %v", len(entries), entries)
	}
}

func TestReadSpecMalformed(t *testing.T) {
	s, dir := openTemp(t)
	if err := os.MkdirAll(filepath.Join(dir, "control"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "control", "etcd-cluster-spec"), []byte("{junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := s.ReadSpec(t.Context())
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("ReadSpec(junk) = %v, want a decode error", err)
	}
	if !strings.Contains(err.Error(), KeySpec) {
		t.Errorf("error %q does not name the object", err)
	}
}

// Exactly one of many racing creators wins, even across separately opened
// stores (as separate agent processes have).
func TestCreateOnceRace(t *testing.T) {
	_, dir := openTemp(t)
	const n = 16
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(t.Context(), "file://"+dir, Options{})
			if err != nil {
				results[i] = err
				return
			}
			defer s.Close()
			results[i] = s.CreateCreated(t.Context(), spec.ClusterCreated{Timestamp: spec.Int64(i), ClusterToken: string(rune('a' + i))})
		}()
	}
	wg.Wait()
	wins := 0
	for i, err := range results {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, ErrExists):
			t.Errorf("creator %d: %v", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d creators won, want exactly 1", wins)
	}
	s, _ := Open(t.Context(), "file://"+dir, Options{})
	defer s.Close()
	if _, err := s.ReadCreated(t.Context()); err != nil {
		t.Fatal(err)
	}
	keys, err := s.List(t.Context(), "control/", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != KeyCreated {
		t.Errorf("List(control/) = %v, want only the marker (no temp files)", keys)
	}
}

func TestOpenErrors(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		url     string
		opts    Options
		wantErr error
		wantMsg string
	}{
		{name: "no scheme", url: "/tmp/x", wantErr: ErrBadURL, wantMsg: "missing scheme"},
		{name: "relative file", url: "file://relative/path", wantErr: ErrBadURL, wantMsg: "absolute path"},
		{name: "missing dir, read", url: "file://" + filepath.Join(tmp, "nope"), wantErr: ErrUnreachable, wantMsg: "does not exist"},
		{name: "path is a file", url: "file://" + file, wantErr: ErrUnreachable, wantMsg: "not a directory"},
		{name: "parent is a file", url: "file://" + filepath.Join(file, "sub"), opts: Options{Create: true}, wantErr: ErrUnreachable},
		{name: "unknown scheme", url: "ftp://host/x", wantErr: ErrBadURL, wantMsg: `unsupported scheme "ftp"; the schemes are file, s3, gs, azblob`},
		{name: "http is no store", url: "https://bucket.example.com/x", wantErr: ErrBadURL, wantMsg: `unsupported scheme "https"`},
		{name: "fragment", url: "file://" + tmp + "/run#2/store", wantErr: ErrBadURL, wantMsg: "%23"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(t.Context(), tt.url, tt.opts)
			if err == nil {
				s.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("err = %q, want it to mention %q", err, tt.wantMsg)
			}
		})
	}
}

// CheckURL refuses what Open could never open, without opening anything.
func TestCheckURL(t *testing.T) {
	tests := []struct {
		name, url, wantMsg string
	}{
		{name: "file", url: "file:///var/lib/etcd-backups"},
		{name: "file on localhost", url: "file://localhost/var/lib/etcd-backups"},
		{name: "s3 with a prefix and an endpoint", url: "s3://bucket/cluster/main?endpoint=http://127.0.0.1:9000&use_path_style=true"},
		{name: "gs", url: "gs://bucket/main"},
		{name: "azblob", url: "azblob://container"},
		{name: "unknown scheme", url: "ftp://host/x", wantMsg: `unsupported scheme "ftp"; the schemes are file, s3, gs, azblob: use file:///path`},
		{name: "scheme in capitals", url: "FTP://host/x", wantMsg: `unsupported scheme "ftp"`},
		{name: "no scheme", url: "bucket/x", wantMsg: "missing scheme"},
		{name: "relative file", url: "file://relative/path", wantMsg: "absolute path"},
		{name: "file without a path", url: "file://", wantMsg: "absolute path"},
		{name: "no bucket", url: "s3:///x", wantMsg: "no bucket or container name"},
		{name: "two prefixes", url: "gs://bucket/a?prefix=b/", wantMsg: "not both"},
		{name: "fragment", url: "file:///tmp/run#2", wantMsg: "%23"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckURL(tt.url)
			if tt.wantMsg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBadURL) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("CheckURL(%q) = %v, want ErrBadURL mentioning %q", tt.url, err, tt.wantMsg)
			}
		})
	}
}

// A path with special characters works when percent-encoded.
func TestEncodedPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run#2 x")
	u := (&url.URL{Scheme: "file", Path: dir}).String()
	s, err := Open(t.Context(), u, Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(t.Context(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "k")); err != nil {
		t.Errorf("object not under %s: %v", dir, err)
	}
}

func TestListSkipsTempFiles(t *testing.T) {
	s, dir := openTemp(t)
	ctx := t.Context()
	for _, k := range []string{"a/1", "a/2", "b/3"} {
		if err := s.Write(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	for _, junk := range []string{"a/.create-123", "a/2.1f2e.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, junk), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := s.List(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "a/1,a/2,b/3" {
		t.Errorf("List = %v", keys)
	}
	dirs, err := s.List(ctx, "", "/")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(dirs, ",") != "a/,b/" {
		t.Errorf("List with delimiter = %v", dirs)
	}
	if err := s.Delete(ctx, "a/1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a/1"); err != nil {
		t.Errorf("deleting a missing object: %v", err)
	}
	if _, err := s.Read(ctx, "a/1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Read after Delete: %v", err)
	}
}

func TestCloudBucketURL(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "s3://bucket", want: "s3://bucket"},
		{in: "s3://bucket/", want: "s3://bucket/"},
		{in: "s3://bucket/my-cluster/backups/etcd/main", want: "s3://bucket?prefix=my-cluster%2Fbackups%2Fetcd%2Fmain%2F"},
		{in: "s3://bucket/a/b/?endpoint=http://127.0.0.1:9000&region=us-east-1&use_path_style=true",
			want: "s3://bucket?endpoint=http%3A%2F%2F127.0.0.1%3A9000&prefix=a%2Fb%2F&region=us-east-1&use_path_style=true"},
		{in: "gs://bucket/x", want: "gs://bucket?prefix=x%2F"},
		{in: "azblob://container/x?localemu=true", want: "azblob://container?localemu=true&prefix=x%2F"},
		{in: "s3:///x", err: "no bucket"},
		{in: "s3://bucket/x?prefix=y/", err: "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			u, err := url.Parse(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := cloudBucketURL(u)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %q, %v; want error containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// Every binary that opens a store understands the four schemes.
func TestDriversRegistered(t *testing.T) {
	for _, scheme := range []string{"file", "s3", "gs", "azblob"} {
		if !blob.DefaultURLMux().ValidBucketScheme(scheme) {
			t.Errorf("no blob driver registered for %s://", scheme)
		}
	}
}

// With STORAGE_EMULATOR_HOST set, a gs:// store goes to that address and
// nowhere else: it looks for no credentials, so the GCE metadata server
// (here a loopback listener named by GCE_METADATA_HOST) is never asked. An
// address with a scheme, which gcsblob would turn into a DNS lookup of
// "http", is refused before any request.
func TestOpenGCSEmulatorHost(t *testing.T) {
	closed := closedLoopbackAddr(t)
	tests := []struct {
		name     string
		emulator string
		wantErr  error
		wantMsg  string
	}{
		{name: "host and port", emulator: closed, wantErr: ErrUnreachable, wantMsg: "http://" + closed + "/storage/v1/"},
		{name: "with a scheme", emulator: "http://" + closed, wantErr: ErrBadURL, wantMsg: "STORAGE_EMULATOR_HOST"},
		{name: "with https", emulator: "https://" + closed, wantErr: ErrBadURL, wantMsg: "without a scheme"},
		{name: "with a path", emulator: closed + "/storage/v1", wantErr: ErrBadURL, wantMsg: "HOST:PORT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			metadata := listenLoopback(t)
			t.Setenv("GCE_METADATA_HOST", metadata.Addr().String())
			t.Setenv("STORAGE_EMULATOR_HOST", tt.emulator)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			s, err := Open(ctx, "gs://bucket/cluster/main", Options{})
			if err == nil {
				s.Close()
				t.Fatal("opened a store with no emulator listening")
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tt.wantErr, tt.wantMsg)
			}
			if n := metadata.accepted(); n != 0 {
				t.Fatalf("the GCE metadata server was asked %d times", n)
			}
		})
	}
}

func TestCheckGCSEmulatorHost(t *testing.T) {
	tests := []struct {
		host string
		ok   bool
	}{
		{"", true},
		{"127.0.0.1:4443", true},
		{"localhost:4443", true},
		{"[::1]:4443", true},
		{"http://127.0.0.1:4443", false},
		{"127.0.0.1:4443/", false},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			if err := checkGCSEmulatorHost(tt.host); (err == nil) != tt.ok {
				t.Fatalf("checkGCSEmulatorHost(%q) = %v, want ok=%v", tt.host, err, tt.ok)
			}
		})
	}
}

// closedLoopbackAddr is a loopback address on which nothing listens.
func closedLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// countingListener accepts and drops connections, counting them.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (c *countingListener) accepted() int64 { return c.n.Load() }

func listenLoopback(t *testing.T) *countingListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &countingListener{Listener: l}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return c
}

// A file:// prefix that churns, objects created and deleted as capture
// and its merges do, lists without error: the walk that loses a file
// under it is tried again.
func TestListUnderChurn(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	for i := range 50 {
		if err := s.Create(ctx, "wal/tok/keep-"+string(rune('a'+i%26))+string(rune('a'+i/26)), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var churned sync.WaitGroup
	churned.Add(2)
	for w := range 2 {
		go func() {
			defer churned.Done()
			deadline := time.Now().Add(3 * time.Second)
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "wal/tok/churn-" + string(rune('a'+w)) + "-" + string(rune('a'+i%26))
				_ = s.Create(ctx, key, []byte("segment"))
				_ = s.Delete(ctx, key)
			}
		}()
	}
	defer func() { close(stop); churned.Wait() }()
	for i := range 300 {
		keys, err := s.List(ctx, "wal/tok/", "")
		if err != nil {
			t.Fatalf("list %d under churn: %v", i, err)
		}
		kept := 0
		for _, k := range keys {
			if strings.HasPrefix(k, "wal/tok/keep-") {
				kept++
			}
		}
		if kept != 50 {
			t.Fatalf("list %d under churn: %d of the 50 lasting objects", i, kept)
		}
	}
}

// A file:// store holds every key of etcd and the CA's key: it is made
// 0700, and every object, however written, is 0600 in 0700 folders,
// whatever the umask.
func TestFileStorePermissions(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	s, dir := openTemp(t)
	ctx := t.Context()
	if err := s.Write(ctx, "control/etcd-cluster-spec", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "2026-01-01T00:00:00Z-000001/etcd.backup.gz", strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "pki/ca.key", []byte("key")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateFrom(ctx, "wal/t/seg", strings.NewReader("seg")); err != nil {
		t.Fatal(err)
	}
	var checked int
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %o, want %o", path, got, want)
		}
		checked++
		return nil
	})
	if err != nil || checked != 10 {
		t.Fatalf("walked %d entries (want 10: the store, 5 folders, 4 objects): %v", checked, err)
	}
	// A failed upload leaves nothing behind, not even its temporary file.
	if err := s.Put(ctx, "control/x", iotest.ErrReader(errors.New("source failed"))); err == nil {
		t.Fatal("a failed upload succeeded")
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "control")); len(entries) != 1 {
		t.Errorf("control/ holds %v after a failed upload", entries)
	}
	// Keys that would leave the store, or that fileblob would read under
	// another name, are refused.
	for _, key := range []string{"../x", "a/../../x", "/x", "a//b", "", "a/", "x../y", "a/\x1bb", "a/__0x2f__", "a/\xff"} {
		if err := s.Write(ctx, key, nil); !errors.Is(err, ErrBadKey) {
			t.Errorf("Write(%q): %v, want ErrBadKey", key, err)
		}
		if err := s.Create(ctx, key, nil); !errors.Is(err, ErrBadKey) {
			t.Errorf("Create(%q): %v, want ErrBadKey", key, err)
		}
	}
	// Names that only look like those are kept, and read back.
	for _, key := range []string{"a/__0xzz", "a/x..y", "a/.hidden", "a/b_0x2f"} {
		if err := s.Write(ctx, key, []byte(key)); err != nil {
			t.Errorf("Write(%q): %v", key, err)
			continue
		}
		if got, err := s.ReadMax(ctx, key, 100); err != nil || string(got) != key {
			t.Errorf("ReadMax(%q) = %q, %v", key, got, err)
		}
	}
}

// A store's identity is the same for every spelling of its URL that
// names the same bucket or folder and prefix, and differs otherwise.
func TestIdentity(t *testing.T) {
	id := func(u string) string {
		t.Helper()
		s, err := Identity(u)
		if err != nil {
			t.Fatalf("Identity(%q): %v", u, err)
		}
		return s
	}
	same := [][]string{
		{"s3://bkt/main", "s3://bkt/main/", "s3://BKT//main?region=eu-west-1", "s3://bkt/main?endpoint=http://127.0.0.1:9000&use_path_style=true"},
		{"file:///var/lib/backups/main", "file:///var/lib/backups/main/", "file:///var/lib//backups/./main"},
		{"gs://bkt", "gs://bkt/"},
	}
	seen := map[string]string{}
	for _, group := range same {
		want := id(group[0])
		if len(want) != 16 {
			t.Errorf("Identity(%q) = %q, want 16 hex digits", group[0], want)
		}
		for _, u := range group[1:] {
			if got := id(u); got != want {
				t.Errorf("Identity(%q) = %s, Identity(%q) = %s: want them equal", u, got, group[0], want)
			}
		}
		if other, ok := seen[want]; ok {
			t.Errorf("%s and %s share identity %s", group[0], other, want)
		}
		seen[want] = group[0]
	}
	for _, u := range []string{"s3://bkt/other", "s3://other/main", "azblob://bkt/main", "gs://bkt/main"} {
		if got := id(u); seen[got] != "" {
			t.Errorf("Identity(%q) = %s, the identity of %s", u, got, seen[got])
		}
	}
	if _, err := Identity("ftp://x/y"); !errors.Is(err, ErrBadURL) {
		t.Errorf("Identity of an ftp URL: %v, want ErrBadURL", err)
	}
}
