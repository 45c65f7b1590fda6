package changelog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
)

// Applied says what Apply did.
type Applied struct {
	// From is the snapshot's revision, To the revision reached.
	From, To int64
	// Segments and Revisions count what was read and applied.
	Segments  int
	Revisions int64
	// Leases is the number of leases the result holds.
	Leases int
	// Digest is the revision whose digest, recorded by capture, the
	// result was checked against: the newest after the snapshot and at
	// or before the target; 0 when there was none.
	Digest int64
	// Keys are the IDs of the keys of the encrypted segments read: every
	// node that applies the same segments needs them.
	Keys []string
}

// ApplyOptions are Apply's keys and bound.
type ApplyOptions struct {
	// Keys decrypt encrypted segments.
	Keys *crypt.Keyring
	// MaxBytes bounds the snapshot file as it grows; 0 is no bound.
	MaxBytes int64
}

// ErrTooLarge means the snapshot grew past its bound while segments were
// applied.
var ErrTooLarge = errors.New("changelog: snapshot too large")

// SnapshotRevision is the etcd revision of a snapshot whose status
// reports rev: an empty store is at revision 1, where etcd starts, though
// its key bucket holds nothing to say so.
func SnapshotRevision(rev int64) int64 { return max(rev, 1) }

// UnknownTTL is the TTL, in seconds, given to a lease whose granted TTL
// capture could not learn (granted and revoked between two polls, yet
// attached to a key live at the target).
const UnknownTTL = 60

// Commit the write transaction every so many revisions or bytes: memory
// stays bounded whatever the number of segments.
const (
	commitRevisions = 20000
	commitBytes     = 64 << 20
)

// Apply brings the snapshot db at path, a verified snapshot of a full
// backup with etcd's sha256 trailer, forward from its own revision to
// revision to, with the segments of timeline; it leaves a snapshot with
// a fresh trailer that the restore tool of any etcd version accepts.
//
// It writes each revision's changes into the key bucket exactly as etcd
// wrote them, and sets the lease bucket to the leases live at to, so a
// restore brings back every lease with its granted TTL and keys. The
// segments are checked as they are read (sha256, chain, order); any
// fault is an error wrapping ErrCorrupt or ErrGap, and the file is then
// of no use. Encrypted segments are decrypted with opts.Keys; one whose
// key is not held is an error wrapping ErrNoKey. A file that grows past
// opts.MaxBytes is an error wrapping ErrTooLarge, checked at each commit.
func Apply(ctx context.Context, s Store, path, timeline string, to int64, opts ApplyOptions) (Applied, error) {
	out := Applied{}
	refs, err := List(ctx, s, timeline)
	if err != nil {
		return out, err
	}
	if err := stripTrailer(path); err != nil {
		return out, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, Timeout: 5 * time.Second})
	if err != nil {
		return out, fmt.Errorf("changelog: open snapshot %s: %w", path, err)
	}
	a := &applier{db: db, path: path, maxBytes: opts.MaxBytes, keys: opts.Keys, leases: map[int64]int64{}, ttls: map[int64]int64{}, revoked: map[int64]bool{}, referenced: map[int64]bool{}}
	err = a.apply(ctx, s, refs, timeline, to, &out)
	if a.tx != nil {
		// Failed midway: bbolt's Close waits for an open write
		// transaction, forever.
		_ = a.tx.Rollback()
		a.tx = nil
	}
	if cerr := db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("changelog: close snapshot %s: %w", path, cerr)
	}
	if err != nil {
		return out, err
	}
	return out, appendTrailer(path)
}

type applier struct {
	db   *bolt.DB
	tx   *bolt.Tx
	keys *crypt.Keyring
	// path is the snapshot's file, and maxBytes its bound (0: none).
	path     string
	maxBytes int64
	// leases are those live at the point reached, with their TTLs; ttls
	// every TTL learned; revoked the leases known gone; referenced those
	// a key written was attached to.
	leases, ttls        map[int64]int64
	revoked, referenced map[int64]bool
	pendingRevs         int
	pendingBytes        int
	// base is the snapshot's revision; digest the newest digest record
	// after it and at or before the target.
	base   int64
	digest *Record
}

func (a *applier) apply(ctx context.Context, s Store, refs []Ref, timeline string, to int64, out *Applied) error {
	base, err := a.readBase()
	if err != nil {
		return err
	}
	out.From, out.To, a.base = base, base, base
	if to < base {
		return fmt.Errorf("%w: revision %d is before the backup's own revision %d", ErrRange, to, base)
	}
	covered := base
	var chain []byte // unknown until the first segment is read
	lastEnded := false
	i := 0
	for ; i < len(refs) && covered < to; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		ref := refs[i]
		if ref.First > covered+1 {
			return fmt.Errorf("%w: timeline %s has no segment with revisions %d to %d (the next starts at %d)", ErrGap, timeline, covered+1, ref.First-1, ref.First)
		}
		ended, err := a.segment(ctx, s, ref, to, &covered, &chain, out)
		if err != nil {
			return err
		}
		lastEnded = ended
	}
	if covered < to {
		return fmt.Errorf("%w: timeline %s reaches revision %d; revision %d is not captured yet", ErrRange, timeline, covered, to)
	}
	// A lease found gone at the target may be recorded just after it, at
	// the head of the next segment.
	if lastEnded && i < len(refs) && refs[i].First == to+1 {
		if err := a.leadingLeases(ctx, s, refs[i], to); err != nil {
			return err
		}
	}
	if err := a.writeLeases(); err != nil {
		return err
	}
	if err := a.commit(); err != nil {
		return err
	}
	out.Leases = len(a.leases)
	if a.digest != nil {
		if err := a.checkDigest(*a.digest); err != nil {
			return err
		}
		out.Digest = a.digest.Revision
	}
	return nil
}

// checkDigest computes the digest of the keys live at d's revision in
// the result, and refuses it if it is not the one etcd gave.
func (a *applier) checkDigest(d Record) error {
	var got Digest
	err := a.db.View(func(tx *bolt.Tx) error {
		// Every revision up to the digest's, in order: each key's share is
		// that of its newest version, and goes with a tombstone.
		shares := map[string][2]uint64{}
		c := tx.Bucket(schema.Key.Name()).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) < 17 {
				return fmt.Errorf("%w: the key bucket holds a key of %d bytes", ErrCorrupt, len(k))
			}
			if mvcc.BytesToRev(k[:17]).Main > d.Revision {
				break
			}
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(v, &kv); err != nil {
				return fmt.Errorf("%w: the key bucket holds an unreadable value at %x: %w", ErrCorrupt, k, err)
			}
			if len(kv.Key) == 0 {
				// The mark etcdutl's --bump-revision leaves: no key a
				// client can read.
				continue
			}
			if old, ok := shares[string(kv.Key)]; ok {
				got.remove(old)
				delete(shares, string(kv.Key))
			}
			if len(k) == 17 { // a put; a tombstone ends with 't'
				x := kvHash(&kv)
				got.add(x)
				shares[string(kv.Key)] = x
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if got != d.Digest {
		return fmt.Errorf("%w: at revision %d the restored data holds %d keys that do not match the digest capture read from etcd (%d keys): a segment or the backup does not hold what etcd held",
			ErrCorrupt, d.Revision, got.Keys, d.Digest.Keys)
	}
	return nil
}

// readBase reads the snapshot's revision and leases.
func (a *applier) readBase() (int64, error) {
	var rev int64
	err := a.db.View(func(tx *bolt.Tx) error {
		kb := tx.Bucket(schema.Key.Name())
		if kb == nil {
			return fmt.Errorf("%w: the snapshot has no key bucket", ErrCorrupt)
		}
		if k, _ := kb.Cursor().Last(); k != nil {
			if len(k) < 17 {
				return fmt.Errorf("%w: the snapshot's key bucket holds a key of %d bytes", ErrCorrupt, len(k))
			}
			rev = mvcc.BytesToRev(k[:17]).Main
		}
		rev = SnapshotRevision(rev)
		if lb := tx.Bucket(schema.Lease.Name()); lb != nil {
			return lb.ForEach(func(_, v []byte) error {
				var l leasepb.Lease
				if err := proto.Unmarshal(v, &l); err != nil {
					return fmt.Errorf("%w: the snapshot holds an unreadable lease: %v", ErrCorrupt, err)
				}
				a.leases[l.ID], a.ttls[l.ID] = l.TTL, l.TTL
				return nil
			})
		}
		return nil
	})
	return rev, err
}

// segment applies one segment's revisions after *covered up to to, and
// reports whether the segment ended exactly at to.
func (a *applier) segment(ctx context.Context, s Store, ref Ref, to int64, covered *int64, chain *[]byte, out *Applied) (bool, error) {
	seg, rc, err := openSegment(ctx, s, ref, a.keys)
	if isNotFound(err) && ref.First <= *covered {
		return false, nil // merged into the segment applied before it, then deleted
	}
	if err != nil {
		return false, err
	}
	defer rc.Close()
	if seg.Header.Last <= *covered {
		return false, nil // all applied from another segment already
	}
	out.Segments++
	if e := seg.Header.Encryption; e != nil && !slices.Contains(out.Keys, e.KeyID) {
		out.Keys = append(out.Keys, e.KeyID)
	}
	beyond := false
	for {
		before := seg.Chain()
		rec, err := seg.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, err
		}
		switch rec.Kind {
		case KindRevision:
			switch {
			case rec.Revision <= *covered:
				// Overlap with what another writer's segment gave.
			case rec.Revision <= to:
				if rec.Revision == *covered+1 && *chain != nil && !bytes.Equal(before, *chain) {
					return false, fmt.Errorf("%w: %s does not follow the segment before it at revision %d (the hash chain breaks)", ErrCorrupt, ref.Key, *covered)
				}
				if err := a.revision(rec); err != nil {
					return false, err
				}
				*covered, *chain = rec.Revision, seg.Chain()
				out.To = rec.Revision
				out.Revisions++
			default:
				beyond = true
			}
		case KindGrant:
			if !beyond && rec.Revision <= to {
				a.grant(rec.Lease, rec.TTL)
			}
		case KindRevoke:
			if !beyond && rec.Revision <= to {
				a.revoke(rec.Lease)
			}
		case KindDigest:
			if rec.Revision > a.base && rec.Revision <= to && rec.Revision <= *covered && (a.digest == nil || rec.Revision > a.digest.Revision) {
				d := rec
				a.digest = &d
			}
		}
	}
	return !beyond && seg.Header.Last == to, nil
}

// leadingLeases applies the lease records at the head of the segment
// after the target, up to its first revision.
func (a *applier) leadingLeases(ctx context.Context, s Store, ref Ref, to int64) error {
	seg, rc, err := openSegment(ctx, s, ref, a.keys)
	if err != nil {
		return err
	}
	defer rc.Close()
	for {
		rec, err := seg.Next()
		if errors.Is(err, io.EOF) || (err == nil && rec.Kind == KindRevision) {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case rec.Kind == KindGrant && rec.Revision <= to:
			a.grant(rec.Lease, rec.TTL)
		case rec.Kind == KindRevoke && rec.Revision <= to:
			a.revoke(rec.Lease)
		}
	}
}

func (a *applier) grant(id, ttl int64) {
	if ttl > 0 {
		a.ttls[id] = ttl
	}
	if _, ok := a.ttls[id]; !ok {
		a.ttls[id] = UnknownTTL
	}
	a.leases[id] = a.ttls[id]
	delete(a.revoked, id)
}

func (a *applier) revoke(id int64) {
	delete(a.leases, id)
	a.revoked[id] = true
}

// revision writes one revision's changes into the key bucket.
func (a *applier) revision(rec Record) error {
	if a.tx == nil {
		tx, err := a.db.Begin(true)
		if err != nil {
			return fmt.Errorf("changelog: %w", err)
		}
		a.tx = tx
	}
	b := a.tx.Bucket(schema.Key.Name())
	b.FillPercent = 0.9 // appends, as etcd's own sequential puts
	for i, e := range rec.Events {
		key := mvcc.RevToBytes(mvcc.Revision{Main: rec.Revision, Sub: int64(i)}, mvcc.NewRevBytes())
		if e.Tombstone {
			key = append(key, 't')
		} else if id := leaseOf(e.Value); id != 0 {
			a.referenced[id] = true
		}
		// bbolt keeps the value until the commit; the record's is reused.
		if err := b.Put(key, bytes.Clone(e.Value)); err != nil {
			return fmt.Errorf("changelog: write revision %d: %w", rec.Revision, err)
		}
		a.pendingBytes += len(key) + len(e.Value)
	}
	a.pendingRevs++
	if a.pendingRevs >= commitRevisions || a.pendingBytes >= commitBytes {
		return a.commit()
	}
	return nil
}

func (a *applier) commit() error {
	if a.tx == nil {
		return nil
	}
	err := a.tx.Commit()
	a.tx, a.pendingRevs, a.pendingBytes = nil, 0, 0
	if err != nil {
		return fmt.Errorf("changelog: commit: %w", err)
	}
	if a.maxBytes > 0 {
		if st, err := os.Stat(a.path); err == nil && st.Size() > a.maxBytes {
			return fmt.Errorf("%w: %s grew to %d bytes bringing it forward, past the %d allowed (--max-snapshot-bytes, or the data dir's free space less the reserve); stopped there",
				ErrTooLarge, a.path, st.Size(), a.maxBytes)
		}
	}
	return nil
}

// leaseOf reads the lease field (6) of a stored mvccpb.KeyValue.
func leaseOf(kv []byte) int64 {
	for len(kv) > 0 {
		num, typ, n := protowire.ConsumeTag(kv)
		if n < 0 {
			return 0
		}
		kv = kv[n:]
		if num == 6 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(kv)
			if n < 0 {
				return 0
			}
			return int64(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, kv)
		if n < 0 {
			return 0
		}
		kv = kv[n:]
	}
	return 0
}

// writeLeases replaces the lease bucket with the leases live at the
// target, and those a key written is attached to unless known gone.
func (a *applier) writeLeases() error {
	for id := range a.referenced {
		if _, live := a.leases[id]; !live && !a.revoked[id] {
			ttl, ok := a.ttls[id]
			if !ok {
				ttl = UnknownTTL
			}
			a.leases[id] = ttl
		}
	}
	if a.tx == nil {
		tx, err := a.db.Begin(true)
		if err != nil {
			return fmt.Errorf("changelog: %w", err)
		}
		a.tx = tx
	}
	name := schema.Lease.Name()
	if a.tx.Bucket(name) != nil {
		if err := a.tx.DeleteBucket(name); err != nil {
			return fmt.Errorf("changelog: leases: %w", err)
		}
	}
	b, err := a.tx.CreateBucket(name)
	if err != nil {
		return fmt.Errorf("changelog: leases: %w", err)
	}
	for id, ttl := range a.leases {
		v, err := proto.Marshal(&leasepb.Lease{ID: id, TTL: ttl})
		if err != nil {
			return fmt.Errorf("changelog: lease %x: %w", id, err)
		}
		if err := b.Put(binary.BigEndian.AppendUint64(nil, uint64(id)), v); err != nil {
			return fmt.Errorf("changelog: lease %x: %w", id, err)
		}
	}
	return nil
}

// stripTrailer removes etcd's sha256 trailer from a verified snapshot, so
// that bbolt sees the database alone.
func stripTrailer(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	if st.Size()%512 != sha256.Size {
		return fmt.Errorf("changelog: snapshot %s has no sha256 trailer (size %d)", path, st.Size())
	}
	if err := os.Truncate(path, st.Size()-sha256.Size); err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	return nil
}

// appendTrailer appends the sha256 of the file, as etcd does to a
// snapshot it streams, and syncs it.
func appendTrailer(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("changelog: read %s: %w", path, err)
	}
	if _, err := f.Write(h.Sum(nil)); err != nil {
		return fmt.Errorf("changelog: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	return f.Close()
}

// Covering returns the headers of the segments Apply would read to bring
// a snapshot at revision from forward to revision to, in order, reading
// only their headers: what a restore's dry run shows. It fails as Apply
// does on a gap or a revision not captured yet, without the checks that
// need the bodies (sha256, chain, order).
func Covering(ctx context.Context, s Store, timeline string, from, to int64) ([]Header, error) {
	return relisting(func() ([]Header, error) { return covering(ctx, s, timeline, from, to) })
}

func covering(ctx context.Context, s Store, timeline string, from, to int64) ([]Header, error) {
	refs, err := List(ctx, s, timeline)
	if err != nil {
		return nil, err
	}
	var out []Header
	covered := from
	for i := 0; i < len(refs) && covered < to; i++ {
		ref := refs[i]
		if ref.First > covered+1 {
			return out, fmt.Errorf("%w: timeline %s has no segment with revisions %d to %d (the next starts at %d)", ErrGap, timeline, covered+1, ref.First-1, ref.First)
		}
		h, err := ReadHeaderAt(ctx, s, ref.Key)
		if isNotFound(err) && ref.First <= covered {
			continue // merged into one listed before it, then deleted
		}
		if err != nil {
			return out, err
		}
		if h.Last <= covered {
			continue // held by a segment listed before it
		}
		out = append(out, h)
		covered = h.Last
	}
	if covered < to {
		return out, fmt.Errorf("%w: timeline %s reaches revision %d; revision %d is not captured yet", ErrRange, timeline, covered, to)
	}
	return out, nil
}
