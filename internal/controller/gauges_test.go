package controller

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// docs/metrics.md has a line for every metric the agent's packages
// define, and none for a metric they do not.
func TestMetricsDocumented(t *testing.T) {
	defRE := regexp.MustCompile(`Name:\s*"(etcd_manager_[a-z_]+)"`)
	var defined []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range defRE.FindAllStringSubmatch(string(data), -1) {
			defined = append(defined, m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The registry of a real set of metrics holds the same names.
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		reg := prometheus.NewRegistry()
		newMetrics(reg)
		reg.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		if n := regexp.MustCompile(`fqName: "(etcd_manager_[a-z_]+)"`).FindStringSubmatch(d.String()); n != nil && !slices.Contains(defined, n[1]) {
			t.Errorf("%s is registered but not found in the sources", n[1])
		}
	}
	data, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, n := range regexp.MustCompile("(?m)^\\| `(etcd_manager_[a-z_]+)`").FindAllStringSubmatch(string(data), -1) {
		documented = append(documented, n[1])
	}
	if len(defined) < 30 || len(documented) == 0 {
		t.Fatalf("found %d metrics defined, %d documented", len(defined), len(documented))
	}
	for _, n := range defined {
		if !slices.Contains(documented, n) {
			t.Errorf("%s is not in docs/metrics.md", n)
		}
	}
	for _, n := range documented {
		if !slices.Contains(defined, n) {
			t.Errorf("docs/metrics.md lists %s, which no package defines", n)
		}
	}
}

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
	lp := &loop{met: newMetrics(prometheus.NewRegistry()), log: slog.New(slog.DiscardHandler), now: func() time.Time { return now }}
	lp.met.backupSize.WithLabelValues("restored").Set(1) // a kind no longer among the newest
	check := func(when string) {
		t.Helper()
		newest, err := lp.newestOfEachKind(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if newest == nil || newest.Name != metas[3].name {
			t.Errorf("%s: newest %v, want %s", when, newest, metas[3].name)
		}
		m := lp.met
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
	if len(lp.metaCache) != 4 {
		t.Errorf("%d metas kept, want the 4 valid ones", len(lp.metaCache))
	}
	if n := testutil.CollectAndCount(lp.met.backupSize); n != 3 {
		t.Errorf("%d size series, want 3 (periodic, pre-change, other)", n)
	}
	// An hour on, the backups without a valid meta are taken as never to
	// have one, and are not read again.
	now = now.Add(time.Hour)
	check("an hour on")
	if len(lp.metaCache) != 6 || lp.metaCache[metas[4].name] != nil || lp.metaCache[metas[5].name] != nil {
		t.Errorf("metas kept an hour on: %v", lp.metaCache)
	}
	// A meta read is kept (a meta never changes): its object is not read
	// again.
	if err := s.Write(ctx, metas[2].name+"/"+backup.MetaObject, []byte(`{"etcdVersion":"3.6.16","timestamp":3,"size":999,"kind":"periodic"}`)); err != nil {
		t.Fatal(err)
	}
	check("second read")
}
