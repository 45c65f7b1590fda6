package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// startSegmentSource starts a real etcd whose watch the segment subtest
// captures: its segments are the changelog package's own, from its own capture.
func startSegmentSource(t *testing.T) *clientv3.Client {
	t.Helper()
	c, _, _ := startBareSource(t)
	return c
}

// startBareSource starts a real 1-member etcd of the default version with
// more etcd flags, and returns a client of it (which sends requests of up
// to 8 MiB), the member and its etcd binary, to restart it.
func startBareSource(t *testing.T, args ...string) (*clientv3.Client, *harness.BareEtcd, string) {
	t.Helper()
	env := harness.NewEnv(t)
	live := env.NewBareCluster(1, false)
	live.AddArgs(args...)
	bin := filepath.Join(env.BinDir, "etcd-v"+harness.DefaultEtcdVersion, "etcd")
	live.Start(bin)
	c, err := clientv3.New(clientv3.Config{Endpoints: live.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitEtcd(t, c)
	return c, live.Members[0], bin
}

// testSegments holds continuous capture's segments to the store contract
// they rely on: a burst of writes to etcd, then a capture until it is in
// the store, three times, so each burst's last revision ends a segment.
// The segments must list by first revision and by timeline, read back
// whole (header, body sha256, chain), be created once only, and delete.
func testSegments(t *testing.T, ctx context.Context, s *store.Store, etcd *clientv3.Client, timeline string) {
	base := headRevision(t, ctx, etcd)
	var ends []int64
	written := map[string]bool{}
	for burst := range 3 {
		ends = append(ends, writeBurst(t, ctx, etcd, timeline, burst, written))
		captureTo(t, ctx, s, etcd, timeline, base, ends[burst])
	}
	// A later timeline, as a restore starts, whose name extends this one's.
	later := timeline + "-restored"
	laterEnd := writeBurst(t, ctx, etcd, later, 0, map[string]bool{})
	captureTo(t, ctx, s, etcd, later, ends[2], laterEnd)

	tls, err := changelog.Timelines(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	// The store's lexical order: "-" sorts before "/".
	if want := []string{later, timeline}; !slices.Equal(tls, want) {
		t.Fatalf("timelines %q, want %q", tls, want)
	}

	refs, err := changelog.List(ctx, s, timeline)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) < 3 {
		t.Fatalf("%d segments for three captures: %+v", len(refs), refs)
	}
	t.Logf("%s: %d segments of revisions %d to %d", timeline, len(refs), base+1, ends[2])
	// The store lists the keys in order, and a key's order is its first
	// revision's.
	keys, err := s.List(ctx, changelog.Prefix+timeline+"/", "")
	if err != nil {
		t.Fatal(err)
	}
	var refKeys []string
	for _, r := range refs {
		refKeys = append(refKeys, r.Key)
	}
	if !slices.Equal(keys, refKeys) {
		t.Fatalf("store lists %q, changelog.List %q: want the same keys in the same order", keys, refKeys)
	}

	objects := map[string][]byte{}
	ended := map[int64]bool{}
	seen := map[string]bool{}
	var prev changelog.Header
	for i, ref := range refs {
		h, err := changelog.ReadHeaderAt(ctx, s, ref.Key)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ref.Level != 0 || ref.RunStart != (i == 0) || changelog.KeyOf(h) != ref.Key:
			t.Fatalf("segment %d: %+v with header %+v: want level 0, only the first a run start", i, ref, h)
		case i == 0 && (h.First != base+1 || h.Base.Revision != base || h.Prev != changelog.RunStart(timeline, base)):
			t.Fatalf("first segment %+v does not start the run after revision %d", h, base)
		case i > 0 && (h.First != prev.Last+1 || h.Prev != prev.Chain):
			t.Fatalf("segment %+v does not follow %+v", h, prev)
		case i > 0 && ref.First <= refs[i-1].First:
			t.Fatalf("listed out of order: %d after %d", ref.First, refs[i-1].First)
		}
		data := readObject(t, ctx, s, ref.Key)
		objects[ref.Key] = data
		body := data[bytes.IndexByte(data, '\n')+1:]
		if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != h.SHA256 || int64(len(body)) != h.BodySize {
			t.Fatalf("%s: body of %d bytes does not match its header's sha256 and size %d", ref.Key, len(body), h.BodySize)
		}
		rd, err := changelog.NewReader(bytes.NewReader(data), ref.Key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rd.Header, h) {
			t.Fatalf("%s: header read alone %+v, with the body %+v", ref.Key, h, rd.Header)
		}
		for {
			rec, err := rd.Next() // checks size, count, revisions and the chain
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range rec.Events {
				var kv mvccpb.KeyValue
				if err := proto.Unmarshal(ev.Value, &kv); err != nil {
					t.Fatalf("%s: revision %d: %v", ref.Key, rec.Revision, err)
				}
				seen[string(kv.Key)] = true
			}
		}
		ended[h.Last] = true
		prev = h
	}
	if !ended[ends[0]] || !ended[ends[1]] || prev.Last != ends[2] {
		t.Fatalf("segments end at %v, want every burst's end %v among them and the last", ended, ends)
	}
	if !maps.Equal(seen, written) {
		t.Fatalf("segments hold the keys %v, want those written %v", seen, written)
	}

	t.Run("create once", func(t *testing.T) {
		key := refs[1].Key
		for _, tc := range []struct {
			name string
			data []byte
		}{
			{"the same segment again", objects[key]},
			{"another segment under its key", objects[refs[2].Key]},
		} {
			err := s.CreateFrom(ctx, key, bytes.NewReader(tc.data))
			if !errors.Is(err, store.ErrExists) {
				t.Fatalf("%s: %v, want ErrExists", tc.name, err)
			}
			if got := readObject(t, ctx, s, key); !bytes.Equal(got, objects[key]) {
				t.Fatalf("%s: %s changed (%d bytes, was %d)", tc.name, key, len(got), len(objects[key]))
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		for _, ref := range refs {
			if err := s.Delete(ctx, ref.Key); err != nil {
				t.Fatal(err)
			}
		}
		if left, err := changelog.List(ctx, s, timeline); err != nil || len(left) != 0 {
			t.Fatalf("after deleting every segment, the timeline lists %+v (%v)", left, err)
		}
		if tls, err := changelog.Timelines(ctx, s); err != nil || !slices.Equal(tls, []string{later}) {
			t.Fatalf("timelines %q (%v), want only %q", tls, err, later)
		}
		laterRefs, err := changelog.List(ctx, s, later)
		if err != nil || len(laterRefs) == 0 {
			t.Fatalf("the later timeline lists %+v (%v)", laterRefs, err)
		}
		for _, ref := range laterRefs {
			if err := s.Delete(ctx, ref.Key); err != nil {
				t.Fatal(err)
			}
		}
		if tls, err := changelog.Timelines(ctx, s); err != nil || len(tls) != 0 {
			t.Fatalf("timelines %q (%v) after deleting every segment", tls, err)
		}
	})
}

// writeBurst writes a few keys under /<timeline>/<burst>/, deletes one,
// and in the first burst puts one under a lease; it returns the last
// revision.
func writeBurst(t *testing.T, ctx context.Context, etcd *clientv3.Client, timeline string, burst int, written map[string]bool) int64 {
	t.Helper()
	prefix := fmt.Sprintf("/%s/%d/", timeline, burst)
	var rev int64
	for i := range 5 {
		k := fmt.Sprintf("%sk%d", prefix, i)
		_, err := etcd.Put(ctx, k, fmt.Sprintf("value %d of burst %d", i, burst))
		if err != nil {
			t.Fatal(err)
		}
		written[k] = true
	}
	resp, err := etcd.Delete(ctx, prefix+"k0")
	if err != nil {
		t.Fatal(err)
	}
	rev = resp.Header.Revision
	if burst == 0 {
		l, err := etcd.Grant(ctx, 600)
		if err != nil {
			t.Fatal(err)
		}
		k := prefix + "leased"
		resp, err := etcd.Put(ctx, k, "x", clientv3.WithLease(l.ID))
		if err != nil {
			t.Fatal(err)
		}
		written[k], rev = true, resp.Header.Revision
	}
	return rev
}

// captureTo runs the changelog package's capture and upload of timeline, from
// a fresh spool, until revision head is in the store. A timeline with no
// segments yet starts a run after base.
func captureTo(t *testing.T, ctx context.Context, s *store.Store, etcd *clientv3.Client, timeline string, base, head int64) {
	t.Helper()
	c := startCapture(t, ctx, changelog.Default(), s, changelog.Etcd(etcd), timeline, base, slog.LevelWarn)
	harness.WaitFor(t, time.Minute, fmt.Sprintf("capture of %s to reach revision %d in the store", timeline, head), func() bool {
		return c.Status().Durable >= head
	})
	c.stop(t)
}

func headRevision(t *testing.T, ctx context.Context, etcd *clientv3.Client) int64 {
	t.Helper()
	resp, err := etcd.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func readObject(t *testing.T, ctx context.Context, s *store.Store, key string) []byte {
	t.Helper()
	data, err := s.Read(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
