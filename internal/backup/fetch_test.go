package backup

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"

	"github.com/etcd-manager/etcd-manager/internal/store"
)

func TestFetch(t *testing.T) {
	ctx := t.Context()
	s, err := store.Open(ctx, "file://"+filepath.Join(t.TempDir(), "s"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A snapshot as etcd streams one: whole pages, then the sha256 of
	// them.
	pages := make([]byte, 256<<10)
	if _, err := rand.Read(pages); err != nil {
		t.Fatal(err)
	}
	trailer := sha256.Sum256(pages)
	db := append(bytes.Clone(pages), trailer[:]...)
	gzipped := func(b []byte) []byte {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(b)
		zw.Close()
		return gz.Bytes()
	}
	good := gzipped(db)
	sum := sha256.Sum256(good)
	meta, _ := json.Marshal(Meta{EtcdVersion: "3.6.16", Timestamp: 1, SHA256: hex.EncodeToString(sum[:]), CompressedSize: int64(len(good))})
	// A bad trailer under a meta whose sha256 matches the object: the
	// object was stored as it was made, but the snapshot was damaged
	// before it was gzipped.
	badDB := bytes.Clone(db)
	badDB[100] ^= 0x01
	badTrailer := gzipped(badDB)
	badSum := sha256.Sum256(badTrailer)
	badTrailerMeta, _ := json.Marshal(Meta{EtcdVersion: "3.6.16", Timestamp: 1, SHA256: hex.EncodeToString(badSum[:])})
	kopsMeta := []byte(`{"etcdVersion":"3.6.16","timestamp":"1"}`)
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x01
	// A bomb: 64 MiB of zeros in a 64 KiB object.
	bomb := gzipped(make([]byte, 64<<20))
	bombSum := sha256.Sum256(bomb)
	bombMeta, _ := json.Marshal(Meta{EtcdVersion: "3.6.16", Timestamp: 1, SHA256: hex.EncodeToString(bombSum[:]), Size: int64(len(db)), CompressedSize: int64(len(bomb))})
	metaWith := func(extra string) []byte { return []byte(`{"etcdVersion":"3.6.16","timestamp":"1",` + extra + `}`) }
	const gib = 1 << 30

	tests := []struct {
		name      string
		objects   map[string][]byte // under the backup's folder
		fetch     string            // name to fetch; the backup's own when empty
		opts      FetchOptions      // Status is set by the test
		wantErr   error
		errSubstr string
		noStatus  bool // the status is not read
	}{
		{name: "ours", objects: map[string][]byte{DataObject: good, MetaObject: meta}},
		{name: "kops meta without a sha256", objects: map[string][]byte{DataObject: good, MetaObject: kopsMeta}},
		{name: "hashed: a matching sha256 skips the status read", objects: map[string][]byte{DataObject: good, MetaObject: meta},
			opts: FetchOptions{Hashed: true}, noStatus: true},
		{name: "hashed, but a kops meta has no sha256 to match", objects: map[string][]byte{DataObject: good, MetaObject: kopsMeta},
			opts: FetchOptions{Hashed: true}},
		{name: "trailer does not match", objects: map[string][]byte{DataObject: badTrailer, MetaObject: badTrailerMeta},
			opts: FetchOptions{Hashed: true}, wantErr: ErrCorrupt, errSubstr: "sha256 trailer does not match"},
		{name: "no trailer", objects: map[string][]byte{DataObject: gzipped(pages[:1000]), MetaObject: kopsMeta},
			wantErr: ErrCorrupt, errSubstr: "no snapshot with a sha256 trailer"},
		{name: "not found", fetch: "2026-01-01T00:00:00Z-999999", wantErr: ErrNotFound, errSubstr: "2026-01-01T00:00:00Z-999999"},
		{name: "not a name", fetch: "../etc", wantErr: ErrNotFound, errSubstr: "not a backup name"},
		{name: "meta without data", objects: map[string][]byte{MetaObject: meta}, wantErr: ErrCorrupt, errSubstr: "has a meta but no"},
		{name: "junk meta", objects: map[string][]byte{DataObject: good, MetaObject: []byte("{junk")}, wantErr: ErrCorrupt, errSubstr: MetaObject},
		{name: "truncated", objects: map[string][]byte{DataObject: good[:len(good)/2], MetaObject: kopsMeta}, wantErr: ErrCorrupt, errSubstr: "truncated or damaged"},
		{name: "flipped byte", objects: map[string][]byte{DataObject: flipped, MetaObject: meta}, wantErr: ErrCorrupt, errSubstr: DataObject},
		{name: "flipped byte, kops meta", objects: map[string][]byte{DataObject: flipped, MetaObject: kopsMeta}, wantErr: ErrCorrupt, errSubstr: DataObject},
		{name: "not gzip", objects: map[string][]byte{DataObject: db, MetaObject: kopsMeta}, wantErr: ErrCorrupt, errSubstr: DataObject},

		// Bounds on what is unpacked: a meta's size, the agent's
		// maximum and the disk's free space, whichever is smallest.
		{name: "bomb past its meta's size", objects: map[string][]byte{DataObject: bomb, MetaObject: bombMeta},
			wantErr: ErrCorrupt, errSubstr: "more than the 262176 bytes its meta records"},
		{name: "bomb with a kops meta, past the maximum", objects: map[string][]byte{DataObject: bomb, MetaObject: kopsMeta},
			opts: FetchOptions{MaxBytes: 1 << 20}, wantErr: ErrTooLarge, errSubstr: "over 1048576 bytes, the agent's maximum (--max-snapshot-bytes)"},
		{name: "bomb with a kops meta, past the free space", objects: map[string][]byte{DataObject: bomb, MetaObject: kopsMeta},
			opts: FetchOptions{Reserve: 1 << 20, DiskSpace: freeOf(3 << 20)}, wantErr: ErrTempFull, errSubstr: "over 2097152 bytes, the space"},
		{name: "a meta's size over the free space", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"size":10737418240`)},
			opts: FetchOptions{Reserve: gib, DiskSpace: freeOf(2 * gib)}, wantErr: ErrTempFull, errSubstr: "unpacks to 10737418240 bytes (its meta)"},
		{name: "a meta's size over the maximum", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"size":10737418240`)},
			opts: FetchOptions{MaxBytes: gib}, wantErr: ErrTooLarge, errSubstr: "over the agent's maximum of 1073741824"},
		{name: "no room at all", objects: map[string][]byte{DataObject: good, MetaObject: kopsMeta},
			opts: FetchOptions{Reserve: gib, DiskSpace: freeOf(gib / 2)}, wantErr: ErrTempFull, errSubstr: "no room to unpack"},
		{name: "a small disk keeps a tenth free, not a whole reserve", objects: map[string][]byte{DataObject: good, MetaObject: kopsMeta},
			opts: FetchOptions{Reserve: gib, DiskSpace: func(string) (int64, int64, error) { return 600 << 20, 1 << 30, nil }}},
		{name: "a small disk nearly full", objects: map[string][]byte{DataObject: good, MetaObject: kopsMeta},
			opts: FetchOptions{Reserve: gib, DiskSpace: func(string) (int64, int64, error) { return 100 << 20, 1 << 30, nil }}, wantErr: ErrTempFull, errSubstr: "no room to unpack"},
		{name: "good backup at its exact size", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"size":262176`)},
			opts: FetchOptions{MaxBytes: 256<<10 + 32, DiskSpace: freeOf(256<<10 + 32)}},

		// A meta is read from the store: what becomes a path or a
		// bound is checked.
		{name: "meta with a token that leaves the data dir", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"clusterToken":"../../victim"`)},
			wantErr: ErrCorrupt, errSubstr: `cluster token "../../victim"`},
		{name: "meta with a negative size", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"size":-1`)},
			wantErr: ErrCorrupt, errSubstr: "negative"},
		{name: "meta with a bad sha256", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"sha256":"zz"`)},
			wantErr: ErrCorrupt, errSubstr: "not 64 hex digits"},
		{name: "meta over 256 KiB", objects: map[string][]byte{DataObject: good, MetaObject: metaWith(`"pad":"` + strings.Repeat("x", MaxMetaSize) + `"`)},
			wantErr: ErrCorrupt, errSubstr: MetaObject},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("2026-01-01T00:00:00Z-%06d", i)
			for obj, data := range tt.objects {
				if err := s.Write(ctx, name+"/"+obj, data); err != nil {
					t.Fatal(err)
				}
			}
			if tt.fetch != "" {
				name = tt.fetch
			}
			verified := ""
			verify := func(_ context.Context, p string) (snapshot.Status, error) {
				verified = p
				return snapshot.Status{Revision: 7}, nil
			}
			dir := t.TempDir()
			opts := tt.opts
			opts.Status = verify
			meter := &recordingMeter{}
			opts.Meter = meter
			path, _, err := Fetch(ctx, s, name, dir, opts)
			if meter.begun > 0 && (meter.ended != meter.begun || meter.what != "fetch "+name || meter.done > int64(len(tt.objects[DataObject]))) {
				t.Errorf("meter: %+v, want each transfer of fetch %s ended, within the object's %d bytes", meter, name, len(tt.objects[DataObject]))
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errSubstr) {
					t.Fatalf("err %v, want %v containing %q", err, tt.wantErr, tt.errSubstr)
				}
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("a failed fetch left %d files behind", len(entries))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			want := path
			if tt.noStatus {
				want = ""
			}
			if !bytes.Equal(got, db) || verified != want {
				t.Fatalf("fetched %d bytes, read the status of %q, want %q", len(got), verified, want)
			}
			if obj := int64(len(tt.objects[DataObject])); meter.begun != 1 || meter.done != obj {
				t.Errorf("meter: %+v, want one transfer of the object's %d bytes", meter, obj)
			}
		})
	}
}

// freeOf is a disk of 100 GiB with n bytes free.
func freeOf(n int64) func(string) (int64, int64, error) {
	return func(string) (int64, int64, error) { return n, 100 << 30, nil }
}

// Fits judges a backup by its meta alone, as Fetch would before reading
// it; Room is the largest snapshot that fits now.
func TestFitsAndRoom(t *testing.T) {
	const gib = int64(1 << 30)
	opts := FetchOptions{Reserve: gib, MaxBytes: 4 * gib, DiskSpace: freeOf(100 * gib)}
	for _, tt := range []struct {
		name string
		size int64
		want error
	}{
		{"no size recorded", 0, nil},
		{"within both", 4 * gib, nil},
		{"over the maximum", 4*gib + 1, ErrTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := opts.Fits(t.TempDir(), Meta{Size: tt.size}, "b/etcd.backup.gz")
			if !errors.Is(err, tt.want) || (err != nil && !strings.Contains(err.Error(), "b/etcd.backup.gz")) {
				t.Fatalf("Fits: %v, want %v naming the object", err, tt.want)
			}
		})
	}
	if room, err := opts.Room(t.TempDir()); err != nil || room != 4*gib {
		t.Errorf("Room = %d, %v; want the maximum, 4 GiB", room, err)
	}
	small := FetchOptions{Reserve: gib, MaxBytes: 4 * gib, DiskSpace: freeOf(3 * gib)}
	if err := small.Fits(t.TempDir(), Meta{Size: 3 * gib}, "b"); !errors.Is(err, ErrTempFull) {
		t.Errorf("Fits past the free space: %v", err)
	}
	if room, err := small.Room(t.TempDir()); err != nil || room != 2*gib {
		t.Errorf("Room = %d, %v; want the free space less the reserve, 2 GiB", room, err)
	}
}

// The read-ahead passes its source's errors on unchanged after the data
// read before them: a cut stream is no clean end.
func TestReadAheadPassesErrors(t *testing.T) {
	for _, want := range []error{io.EOF, io.ErrUnexpectedEOF, errors.New("boom")} {
		src := io.MultiReader(strings.NewReader(strings.Repeat("y", 300<<10)), &failingReader{err: want})
		ra := newReadAhead(src)
		data, err := io.ReadAll(ra)
		ra.Close()
		if len(data) != 300<<10 {
			t.Errorf("%v: read %d bytes, want %d", want, len(data), 300<<10)
		}
		if want == io.EOF && err != nil || want != io.EOF && !errors.Is(err, want) {
			t.Errorf("source error %v: ReadAll error %v", want, err)
		}
	}
}

type failingReader struct{ err error }

func (f *failingReader) Read([]byte) (int, error) { return 0, f.err }

// recordingMeter records what Fetch tells its meter.
type recordingMeter struct {
	what         string
	total, done  int64
	begun, ended int
}

func (m *recordingMeter) Begin(what string, total int64) (func(int64), func()) {
	m.what, m.total = what, total
	m.begun++
	return func(n int64) { m.done += n }, func() { m.ended++ }
}
