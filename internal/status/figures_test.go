package status

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The backup figures by kind come from the newest meta of each kind in
// the store; a meta once read is not read again, and junk is passed over.
func TestNewestOfEachKind(t *testing.T) {
	ctx := t.Context()
	s, err := store.Open(ctx, "file://"+t.TempDir(), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	metas := []struct{ name, meta string }{
		{"2026-11-24T12:00:00Z-000001", `{"etcdVersion":"3.6.16","timestamp":1,"size":100,"kind":"periodic","seconds":1}`},
		{"2026-11-24T12:00:01Z-000002", `{"etcdVersion":"3.6.16","timestamp":2,"size":200,"kind":"pre-change","seconds":2}`},
		{"2026-11-24T12:00:02Z-000003", `{"etcdVersion":"3.6.16","timestamp":3,"size":300,"kind":"periodic","seconds":3}`},
		{"2026-11-24T12:00:03Z-000004", `{"etcdVersion":"3.6.16","timestamp":4,"size":400}`}, // kops: no kind
		{"2026-11-24T12:00:04Z-000005", `{"etcdVersion":"3.6.16","timestamp":5,"size":-1}`},  // junk
		{"2026-11-24T12:00:05Z-000006", ""}, // being written
	}
	for _, m := range metas {
		key := m.name + "/" + backup.MetaObject
		if m.meta == "" {
			key, m.meta = m.name+"/"+backup.DataObject, "x"
		}
		if err := s.Write(ctx, key, []byte(m.meta)); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 11, 24, 12, 30, 0, 0, time.UTC)
	f := NewFigures(prometheus.NewRegistry(), func() time.Time { return now })
	f.met.backupSize.WithLabelValues("restored").Set(1) // a kind no longer among the newest
	check := func(when string) {
		t.Helper()
		got, err := f.newestOfEachKind(ctx, s, "")
		if err != nil {
			t.Fatal(err)
		}
		if newest := got.Newest; newest == nil || newest.Name != metas[3].name {
			t.Errorf("%s: newest %v, want %s", when, got.Newest, metas[3].name)
		}
		m := f.met
		for _, c := range []struct {
			got, want float64
			what      string
		}{
			{testutil.ToFloat64(m.backupSize.WithLabelValues("periodic")), 300, "periodic size"},
			{testutil.ToFloat64(m.backupDuration.WithLabelValues("periodic")), 3, "periodic duration"},
			{testutil.ToFloat64(m.backupSize.WithLabelValues("pre-change")), 200, "pre-change size"},
			{testutil.ToFloat64(m.backupSize.WithLabelValues("other")), 400, "other size"},
		} {
			if c.got != c.want {
				t.Errorf("%s: %s = %v, want %v", when, c.what, c.got, c.want)
			}
		}
	}
	check("first read")
	if len(f.metaCache) != 4 {
		t.Errorf("%d metas kept, want the 4 valid ones", len(f.metaCache))
	}
	if n := testutil.CollectAndCount(f.met.backupSize); n != 3 {
		t.Errorf("%d size series, want 3 (periodic, pre-change, other)", n)
	}
	// An hour on, the backups without a valid meta are taken as never to
	// have one, and are not read again.
	now = now.Add(time.Hour)
	check("an hour on")
	if len(f.metaCache) != 6 || f.metaCache[metas[4].name] != nil || f.metaCache[metas[5].name] != nil {
		t.Errorf("metas kept an hour on: %v", f.metaCache)
	}
	// A meta read is kept (a meta never changes): its object is not read
	// again.
	if err := s.Write(ctx, metas[2].name+"/"+backup.MetaObject, []byte(`{"etcdVersion":"3.6.16","timestamp":3,"size":999,"kind":"periodic"}`)); err != nil {
		t.Fatal(err)
	}
	check("second read")
}

// Backups dated after the reader's clock and the skew allowed, by name
// or by meta, are neither the newest nor drilled: one planted as
// 2099-… would be both forever. A restore drill takes only this
// cluster's backups.
func TestFiguresLeaveOutTheFuture(t *testing.T) {
	ctx := t.Context()
	s, err := store.Open(ctx, "file://"+t.TempDir(), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return fmt.Sprint(now.Add(d).Unix()) }
	for name, meta := range map[string]string{
		"2026-12-04T09:00:00Z-000001": `{"etcdVersion":"3.6.16","clusterToken":"tok","timestamp":` + at(-time.Hour) + `}`,
		"2026-12-04T09:30:00Z-000001": `{"etcdVersion":"3.6.16","clusterToken":"other","timestamp":` + at(-30*time.Minute) + `}`,
		"2026-12-04T10:00:30Z-000001": `{"etcdVersion":"3.6.16","clusterToken":"tok","timestamp":` + at(30*time.Second) + `}`, // within the skew
		"2026-12-04T10:00:40Z-000001": `{"etcdVersion":"3.6.16","clusterToken":"tok","timestamp":` + at(100*365*24*time.Hour) + `}`,
		"2099-01-01T00:00:00Z-000001": `{"etcdVersion":"3.6.16","clusterToken":"tok","timestamp":` + at(-time.Hour) + `}`,
	} {
		if err := s.Write(ctx, name+"/"+backup.MetaObject, []byte(meta)); err != nil {
			t.Fatal(err)
		}
	}
	f := NewFigures(prometheus.NewRegistry(), func() time.Time { return now })
	for _, tt := range []struct{ timeline, newest, drillable string }{
		{"tok", "2026-12-04T10:00:30Z-000001", "2026-12-04T10:00:30Z-000001"},
		{"other", "2026-12-04T10:00:30Z-000001", "2026-12-04T09:30:00Z-000001"},
		{"", "2026-12-04T10:00:30Z-000001", ""},
	} {
		got, err := f.Read(ctx, s, slog.New(slog.DiscardHandler), tt.timeline)
		if err != nil {
			t.Fatal(err)
		}
		name := func(in *backup.Info) string {
			if in == nil {
				return ""
			}
			return in.Name
		}
		if name(got.Newest) != tt.newest || name(got.Drillable) != tt.drillable {
			t.Errorf("timeline %q: newest %q, drillable %q; want %q, %q", tt.timeline, name(got.Newest), name(got.Drillable), tt.newest, tt.drillable)
		}
		if want := []string{"2099-01-01T00:00:00Z-000001", "2026-12-04T10:00:40Z-000001"}; !slices.Equal(got.Future, want) {
			t.Errorf("timeline %q: left out %v, want %v", tt.timeline, got.Future, want)
		}
	}
	if v := testutil.ToFloat64(f.met.backupLastOK); v != float64(now.Add(30*time.Second).Unix()) {
		t.Errorf("newest backup figure %v, want the one within the skew", v)
	}
}

// Read shows the last failed backup and the drills' record beside the
// newest backup, and hands them back.
func TestReadFigures(t *testing.T) {
	ctx := t.Context()
	s, err := store.Open(ctx, "file://"+t.TempDir(), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	if err := s.RecordBackupFailure(ctx, spec.BackupFailure{Time: at, Node: "n2", Message: "the store is away"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDrill(ctx, spec.DrillResult{Time: at.Add(time.Minute), Node: "n1", Backup: "b", Outcome: spec.EventOK, Seconds: 7}); err != nil {
		t.Fatal(err)
	}
	f := NewFigures(prometheus.NewRegistry(), func() time.Time { return at.Add(time.Hour) })
	got, err := f.Read(ctx, s, slog.New(slog.DiscardHandler), "tok")
	if err != nil {
		t.Fatal(err)
	}
	if got.Newest != nil || got.DrillsErr != nil || got.Drills == nil || got.Drills.LastPassed == nil {
		t.Errorf("read %+v", got)
	}
	for _, c := range []struct {
		got, want float64
		what      string
	}{
		{testutil.ToFloat64(f.met.backupLastFailure), float64(at.Unix()), "last failure"},
		{testutil.ToFloat64(f.met.drillLastOK), float64(at.Add(time.Minute).Unix()), "last drill passed"},
		{testutil.ToFloat64(f.met.drillDuration), 7, "drill duration"},
		{testutil.ToFloat64(f.met.backupLastOK), 0, "newest backup"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	f.Failed(at.Add(2 * time.Hour))
	if got := testutil.ToFloat64(f.met.backupFailures); got != 1 {
		t.Errorf("failures = %v, want 1", got)
	}
}
