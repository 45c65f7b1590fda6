package changelog

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A digest checks a restore against etcd itself. Now and then capture
// reads every key live at a revision it has just cut, from etcd (not
// from the watch), and records their digest; a restore that reaches that
// revision computes the digest of the data it built and refuses a
// mismatch. The digest is a sum of one hash per key, so it does not
// depend on order, on compaction, or on the etcd version (HashKV does).

// Digest is the digest of the keys live at one revision.
type Digest struct {
	Keys int64
	Sum  [2]uint64
}

// kvHash is one key's share of a digest: every field a client reads.
func kvHash(kv *mvccpb.KeyValue) [2]uint64 {
	h := sha256.New()
	var b [8]byte
	for _, f := range [][]byte{kv.Key, kv.Value} {
		h.Write(binary.BigEndian.AppendUint64(b[:0], uint64(len(f))))
		h.Write(f)
	}
	for _, n := range []int64{kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease} {
		h.Write(binary.BigEndian.AppendUint64(b[:0], uint64(n)))
	}
	sum := h.Sum(nil)
	return [2]uint64{binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:16])}
}

func (d *Digest) add(x [2]uint64) {
	d.Keys++
	d.Sum[0] += x[0]
	d.Sum[1] += x[1]
}

func (d *Digest) remove(x [2]uint64) {
	d.Keys--
	d.Sum[0] -= x[0]
	d.Sum[1] -= x[1]
}

// A digest reads at most digestPage keys per request, and sizes each
// page from the keys read so far so that it brings back about
// digestPageBytes: 1000 keys of 512 KiB values came back as half a GiB,
// which gRPC and the client held two and three times over (the agent's
// RSS reached 1.5 GiB during a digest of an 8 GiB database). The first
// page, of sizes not yet seen, is one key: 16 keys of 512 KiB values were
// 8 MiB.
//
// digestPageBytes keeps a response within the largest of the agent's
// pooled gRPC buffers (1 MiB, see etcdproc): pages of 4 MiB took a new
// buffer each, and those, with the values decoded from them, were 10 of
// the 23 MiB the heap held during a backup that a digest overlapped.
const (
	digestPage      = 1000
	digestFirstPage = 1
	digestPageBytes = 512 << 10
)

// nextDigestPage is the limit of the page after one of n keys (n > 0)
// and size bytes.
func nextDigestPage(n int, size int64) int64 {
	return min(max(digestPageBytes*int64(n)/max(size, 1), 1), digestPage)
}

// Ranger is the part of an etcd client a digest needs.
type Ranger interface {
	Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error)
}

// DigestAt reads every key live at rev from etcd, a page at a time, and
// returns their digest.
func DigestAt(ctx context.Context, c Ranger, rev int64) (Digest, error) {
	var d Digest
	from := "\x00"
	limit := int64(digestFirstPage)
	for {
		resp, err := c.Get(ctx, from, clientv3.WithFromKey(), clientv3.WithRev(rev), clientv3.WithLimit(limit),
			clientv3.WithSerializable())
		if err != nil {
			return d, fmt.Errorf("changelog: digest at revision %d: %w", rev, err)
		}
		var size int64
		for _, kv := range resp.Kvs {
			d.add(kvHash(kv))
			size += int64(len(kv.Key) + len(kv.Value))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return d, nil
		}
		limit = nextDigestPage(len(resp.Kvs), size)
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
