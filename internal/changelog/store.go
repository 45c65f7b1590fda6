package changelog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Prefix is where segments live in the store: Prefix<timeline>/<key>. A
// timeline is a cluster token: a restore starts a new one.
const Prefix = "wal/"

// Store is the part of the backup store segments need.
type Store interface {
	CreateFrom(ctx context.Context, key string, r io.Reader) error
	Reader(ctx context.Context, key string) (io.ReadCloser, error)
	List(ctx context.Context, prefix, delimiter string) ([]string, error)
	Delete(ctx context.Context, key string) error
}

// Ref names one segment in the store.
type Ref struct {
	Key   string
	First int64
	Level int
	// RunStart is set on the first segment of a run (its header has a
	// Base): the listing alone shows where runs, and gaps, begin.
	RunStart bool
}

// SegmentKey is the store key of the segment of timeline whose first
// revision is first, at level: keyed by its first revision and written
// create-once, so two writers can never both write one.
func SegmentKey(timeline string, first int64, level int, runStart bool) string {
	suffix := ".seg"
	if runStart {
		suffix = "-base.seg"
	}
	return fmt.Sprintf("%s%s/%020d-L%d%s", Prefix, timeline, first, level, suffix)
}

// KeyOf is the store key of the segment h describes.
func KeyOf(h Header) string { return SegmentKey(h.Timeline, h.First, h.Level, h.Base != nil) }

// parseKey reads a SegmentKey's first revision and level.
func parseKey(key string) (Ref, bool) {
	base := key[strings.LastIndexByte(key, '/')+1:]
	if !strings.HasSuffix(base, ".seg") {
		return Ref{}, false
	}
	name := strings.TrimSuffix(base, ".seg")
	name, runStart := strings.CutSuffix(name, "-base")
	rev, level, ok := strings.Cut(name, "-L")
	if !ok || len(rev) != 20 {
		return Ref{}, false
	}
	first, err := strconv.ParseInt(rev, 10, 64)
	if err != nil || first < 1 {
		return Ref{}, false
	}
	l, err := strconv.Atoi(level)
	if err != nil || l < 0 || l > 9 {
		return Ref{}, false
	}
	return Ref{Key: key, First: first, Level: l, RunStart: runStart}, true
}

// ValidTimeline reports whether t has the form of a cluster token.
func ValidTimeline(t string) bool { return spec.ValidClusterToken(t) }

// Timelines lists the timelines that have segments.
func Timelines(ctx context.Context, s Store) ([]string, error) {
	dirs, err := s.List(ctx, Prefix, "/")
	if err != nil {
		return nil, fmt.Errorf("changelog: list timelines: %w", err)
	}
	var out []string
	for _, d := range dirs {
		t := strings.TrimSuffix(strings.TrimPrefix(d, Prefix), "/")
		if ValidTimeline(t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// List returns a timeline's segments, by first revision, higher levels
// (merged segments) first among equals. Objects that are not segments are
// ignored.
func List(ctx context.Context, s Store, timeline string) ([]Ref, error) {
	if !ValidTimeline(timeline) {
		return nil, fmt.Errorf("changelog: %q is not a timeline (a cluster token)", timeline)
	}
	keys, err := s.List(ctx, Prefix+timeline+"/", "")
	if err != nil {
		return nil, fmt.Errorf("changelog: list %s: %w", timeline, err)
	}
	var out []Ref
	for _, k := range keys {
		if r, ok := parseKey(k); ok {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].First != out[j].First {
			return out[i].First < out[j].First
		}
		return out[i].Level > out[j].Level
	})
	return out, nil
}

// ReadHeaderAt reads the header of the segment at key.
func ReadHeaderAt(ctx context.Context, s Store, key string) (Header, error) {
	r, err := s.Reader(ctx, key)
	if err != nil {
		return Header{}, fmt.Errorf("changelog: %w", err)
	}
	defer r.Close()
	h, err := ReadHeader(r, key)
	if err != nil {
		return h, err
	}
	ref, _ := parseKey(key)
	return h, checkName(ref, h)
}

// openSegment opens the segment ref names for reading, decrypting it with
// keys when it is encrypted; the caller closes the returned closer.
func openSegment(ctx context.Context, s Store, ref Ref, keys *crypt.Keyring) (*Reader, io.Closer, error) {
	rc, err := s.Reader(ctx, ref.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("changelog: %w", err)
	}
	seg, err := NewReader(rc, ref.Key, keys)
	if err == nil {
		err = checkName(ref, seg.Header)
	}
	if err != nil {
		rc.Close()
		return nil, nil, err
	}
	return seg, rc, nil
}

// checkName refuses a segment whose header is not what its key says.
func checkName(ref Ref, h Header) error {
	if ref.First != h.First || ref.Level != h.Level || ref.RunStart != (h.Base != nil) {
		return fmt.Errorf("%w: %s holds revisions %d to %d at level %d: not what its name says", ErrCorrupt, ref.Key, h.First, h.Last, h.Level)
	}
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

func isExists(err error) bool { return errors.Is(err, store.ErrExists) }
