package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// storeBackend is one kind of real backup store the suite runs against.
type storeBackend struct {
	name string
	// open returns the URL of a fresh, empty store (a new prefix in a
	// shared bucket for the cloud kinds) and the environment it needs.
	newStore func(t *testing.T, prefix string) (url string, env []string)
}

// backends starts MinIO, Azurite and fake-gcs-server once for the suite
// and returns the four store kinds the conformance suite covers.
func backends(t *testing.T) []storeBackend {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "conformance")
	azurite := harness.StartAzurite(t)
	azurite.CreateContainer(t, "conformance")
	gcs := harness.StartFakeGCS(t)
	gcs.CreateBucket(t, "conformance")
	return []storeBackend{
		{"file", func(t *testing.T, prefix string) (string, []string) {
			dir := filepath.Join(t.TempDir(), prefix)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			return harness.FileURL(dir), nil
		}},
		{"minio", func(t *testing.T, prefix string) (string, []string) {
			return minio.StoreURL("conformance", prefix), minio.Env()
		}},
		{"azurite", func(t *testing.T, prefix string) (string, []string) {
			return azurite.StoreURL("conformance", prefix), azurite.Env()
		}},
		{"gcs", func(t *testing.T, prefix string) (string, []string) {
			return gcs.StoreURL("conformance", prefix), gcs.Env()
		}},
	}
}

// setEnv sets the store's credentials for this test process.
func setEnv(t *testing.T, env []string) {
	for _, kv := range env {
		k, v, _ := bytes.Cut([]byte(kv), []byte("="))
		t.Setenv(string(k), string(v))
	}
}

func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, url, store.Options{Create: true})
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestStoreConformance holds file://, MinIO (s3://), Azurite (azblob://)
// and fake-gcs-server (gs://) to the one contract the agent relies on,
// continuous capture's segments included (from a real etcd's watch).
func TestStoreConformance(t *testing.T) {
	stores := backends(t)
	etcd := startSegmentSource(t)
	for _, b := range stores {
		t.Run(b.name, func(t *testing.T) {
			url, env := b.newStore(t, "cluster/backups/etcd/main")
			setEnv(t, env)
			s := openStore(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()

			t.Run("missing object is ErrNotFound", func(t *testing.T) {
				_, err := s.Read(ctx, "control/nothing-here")
				if !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("read missing: got %v, want ErrNotFound", err)
				}
			})

			t.Run("write, overwrite, read", func(t *testing.T) {
				for _, v := range []string{"one", "two"} {
					if err := s.Write(ctx, "control/x", []byte(v)); err != nil {
						t.Fatal(err)
					}
					got, err := s.Read(ctx, "control/x")
					if err != nil || string(got) != v {
						t.Fatalf("read back: %q, %v; want %q", got, err, v)
					}
				}
			})

			t.Run("create is once only under a race", func(t *testing.T) {
				const racers = 8
				var wg sync.WaitGroup
				errs := make([]error, racers)
				for i := range racers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[i] = s.Create(ctx, "control/leader/00000000000000000001", fmt.Appendf(nil, "racer %d", i))
					}()
				}
				wg.Wait()
				won := -1
				for i, err := range errs {
					switch {
					case err == nil && won >= 0:
						t.Fatalf("racers %d and %d both created the object", won, i)
					case err == nil:
						won = i
					case !errors.Is(err, store.ErrExists):
						t.Fatalf("racer %d: %v, want ErrExists", i, err)
					}
				}
				if won < 0 {
					t.Fatal("no racer created the object")
				}
				got, err := s.Read(ctx, "control/leader/00000000000000000001")
				if err != nil || string(got) != fmt.Sprintf("racer %d", won) {
					t.Fatalf("object holds %q (%v), want the winner's racer %d", got, err, won)
				}
			})

			t.Run("streamed object appears whole at EOF only", func(t *testing.T) {
				// 12 MiB spans several parts of an S3 multipart upload.
				data := make([]byte, 12<<20)
				if _, err := rand.Read(data); err != nil {
					t.Fatal(err)
				}
				pr, pw := io.Pipe()
				done := make(chan error, 1)
				go func() { done <- s.Put(ctx, "b1/etcd.backup.gz", pr) }()
				if _, err := pw.Write(data[:8<<20]); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Read(ctx, "b1/etcd.backup.gz"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("object visible before EOF: %v", err)
				}
				if _, err := pw.Write(data[8<<20:]); err != nil {
					t.Fatal(err)
				}
				pw.Close()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				got, err := s.Read(ctx, "b1/etcd.backup.gz")
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
				}
			})

			t.Run("failing source or cancel leaves nothing", func(t *testing.T) {
				src := io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("x"), 6<<20)), iotest.ErrReader(errors.New("disk gone")))
				if err := s.Put(ctx, "b2/etcd.backup.gz", src); err == nil {
					t.Fatal("Put of a failing source succeeded")
				}
				cctx, ccancel := context.WithCancel(ctx)
				pr, pw := io.Pipe()
				go func() {
					_, _ = pw.Write(bytes.Repeat([]byte("y"), 6<<20))
					ccancel()
					_, _ = pw.Write(bytes.Repeat([]byte("y"), 6<<20)) // fails once Put gives up
					pw.Close()
				}()
				if err := s.Put(cctx, "b2/etcd.backup.gz", pr); err == nil {
					t.Fatal("Put with a cancelled context succeeded")
				}
				pr.Close()
				if _, err := s.Read(ctx, "b2/etcd.backup.gz"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("a failed upload is visible: %v", err)
				}
			})

			t.Run("list is relative to the store and ordered", func(t *testing.T) {
				for _, k := range []string{"b3/_etcd_backup.meta", "b0/_etcd_backup.meta", "control/etcd-cluster-spec"} {
					if err := s.Write(ctx, k, []byte("{}")); err != nil {
						t.Fatal(err)
					}
				}
				dirs, err := s.List(ctx, "", "/")
				if err != nil {
					t.Fatal(err)
				}
				want := []string{"b0/", "b1/", "b3/", "control/"}
				if !slices.Equal(dirs, want) {
					t.Fatalf("top level: %q, want %q", dirs, want)
				}
				keys, err := s.List(ctx, "control/", "")
				if err != nil {
					t.Fatal(err)
				}
				want = []string{"control/etcd-cluster-spec", "control/leader/00000000000000000001", "control/x"}
				if !slices.Equal(keys, want) {
					t.Fatalf("control/: %q, want %q", keys, want)
				}
			})

			t.Run("stores under other prefixes are invisible", func(t *testing.T) {
				otherURL, _ := b.newStore(t, "cluster/backups/etcd/events")
				other := openStore(t, otherURL)
				keys, err := other.List(ctx, "", "")
				if err != nil {
					t.Fatal(err)
				}
				if len(keys) != 0 {
					t.Fatalf("a fresh store under another prefix lists %q", keys)
				}
			})

			t.Run("delete is idempotent", func(t *testing.T) {
				if err := s.Delete(ctx, "control/x"); err != nil {
					t.Fatal(err)
				}
				if err := s.Delete(ctx, "control/x"); err != nil {
					t.Fatalf("second delete: %v", err)
				}
				if _, err := s.Read(ctx, "control/x"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("deleted object reads as %v", err)
				}
			})

			t.Run("continuous-backup segments", func(t *testing.T) {
				testSegments(t, ctx, s, etcd, "conformance-"+b.name)
			})
		})
	}
}

// TestS3UploadsInParts: an object over one part (5 MiB) goes to S3 as a
// multipart upload from its first part, whose parts the uploader pools,
// rather than after a first 16 MiB read whole into memory (the SDK's
// default); one under a part goes in one PUT. MinIO's ETag says which:
// a multipart upload's ends in -<parts>.
func TestS3UploadsInParts(t *testing.T) {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "parts")
	setEnv(t, minio.Env())
	// The SDK logs to the stderr it finds when the store opens.
	stderr := captureStderr(t)
	s := openStore(t, minio.StoreURL("parts", "p"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tests := []struct {
		size int
		want string // the ETag's suffix, "" for none
	}{
		{3 << 20, ""},
		{12 << 20, "-3"},
	}
	for _, tt := range tests {
		key := fmt.Sprintf("obj-%d", tt.size)
		if err := s.Put(ctx, key, bytes.NewReader(bytes.Repeat([]byte("z"), tt.size))); err != nil {
			t.Fatal(err)
		}
		etag := strings.Trim(minio.ETag(t, "parts", "p/"+key), `"`)
		_, suffix, multipart := strings.Cut(etag, "-")
		if got := map[bool]string{true: "-" + suffix}[multipart]; got != tt.want {
			t.Errorf("a %d-byte object has ETag %s, want the suffix %q", tt.size, etag, tt.want)
		}
		// Every way of reading gives the object back, and none makes the
		// SDK print a warning outside the logs.
		data, err := s.Read(ctx, key)
		if err != nil || len(data) != tt.size {
			t.Fatalf("Read %s: %d bytes, %v", key, len(data), err)
		}
		if data, err = s.ReadMax(ctx, key, int64(tt.size)); err != nil || len(data) != tt.size {
			t.Fatalf("ReadMax %s: %d bytes, %v", key, len(data), err)
		}
		r, err := s.Reader(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, r)
		r.Close()
		if err != nil || n != int64(tt.size) {
			t.Fatalf("Reader %s: %d bytes, %v", key, n, err)
		}
	}
	if out := stderr(); out != "" {
		t.Errorf("the store's reads printed to stderr:\n%s", out)
	}
}

// captureStderr points os.Stderr at a file until the test ends, and
// returns a func that reads what was written to it so far.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	orig := os.Stderr
	os.Stderr = f
	t.Cleanup(func() {
		os.Stderr = orig
		f.Close()
	})
	return func() string {
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

// TestStoreOpenErrors: a cloud store that is missing or down is reported
// as unreachable, never mistaken for an empty store.
func TestStoreOpenErrors(t *testing.T) {
	minio := harness.StartMinIO(t)
	setEnv(t, minio.Env())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, err := store.Open(ctx, minio.StoreURL("no-such-bucket", "x"), store.Options{})
	if !errors.Is(err, store.ErrUnreachable) || !errors.Is(err, store.ErrNoBucket) || !bytes.Contains([]byte(err.Error()), []byte(`"no-such-bucket" does not exist`)) {
		t.Fatalf("missing bucket: %v", err)
	}
	if _, err := store.Open(ctx, minio.StoreURL("bkt", "x")+"&no_such_parameter=1", store.Options{}); !errors.Is(err, store.ErrBadURL) {
		t.Errorf("an unknown query parameter: %v, want ErrBadURL", err)
	}
	_, err = store.Open(ctx, minio.StoreURL("bkt", "x")+"&prefix=y/", store.Options{})
	if !errors.Is(err, store.ErrBadURL) {
		t.Fatalf("path and ?prefix= together: %v, want ErrBadURL", err)
	}

	minio.CreateBucket(t, "bkt")
	// Credentials the store refuses are said to be so, with where the
	// driver reads them, and are not worth trying again.
	setEnv(t, []string{"AWS_SECRET_ACCESS_KEY=wrong"})
	_, err = store.Open(ctx, minio.StoreURL("bkt", "x"), store.Options{})
	if !errors.Is(err, store.ErrDenied) || !store.Permanent(err) || !strings.Contains(err.Error(), "AWS_SECRET_ACCESS_KEY") {
		t.Errorf("wrong credentials: %v, want ErrDenied naming AWS_SECRET_ACCESS_KEY", err)
	}
	setEnv(t, minio.Env())
	s := openStore(t, minio.StoreURL("bkt", "x"))
	minio.Stop()
	_, err = s.Read(ctx, store.KeySpec)
	if !errors.Is(err, store.ErrUnreachable) || errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read with MinIO down: %v, want ErrUnreachable", err)
	}
	_, err = store.Open(ctx, minio.StoreURL("bkt", "x"), store.Options{})
	if !errors.Is(err, store.ErrUnreachable) {
		t.Fatalf("open with MinIO down: %v, want ErrUnreachable", err)
	}
	minio.Start()
	if _, err := s.Read(ctx, store.KeySpec); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read after MinIO restart: %v, want ErrNotFound", err)
	}
}
