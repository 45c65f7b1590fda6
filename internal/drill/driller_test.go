package drill

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// A drill that cannot run (its backup is not in the store) says nothing
// of the backup: it is recorded as not run, in the store, the metrics and
// the history, and the driller is free again.
func TestDrillerRecordsADrillThatCouldNotRun(t *testing.T) {
	url := "file://" + t.TempDir()
	s, err := store.Open(t.Context(), url, store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	var events []spec.Event
	d := NewDriller(prometheus.NewRegistry())
	d.Store, d.Node, d.Log, d.Now = url, "n1", slog.New(slog.DiscardHandler), time.Now
	d.Event = func(e spec.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	d.Panicked = func() { t.Error("the drill panicked") }
	d.Start(t.Context(), Config{DataDir: t.TempDir(), EtcdBinDir: t.TempDir()}, "2026-12-03T00-00-00Z-gone", "3.6.16")
	deadline := time.Now().Add(10 * time.Second)
	for d.Running() {
		if time.Now().After(deadline) {
			t.Fatal("the drill still runs after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Outcome != spec.EventFailed || !strings.Contains(events[0].Message, "could not run") ||
		events[0].Action != "restore-drill 2026-12-03T00-00-00Z-gone" {
		t.Errorf("events = %+v", events)
	}
	if got := testutil.ToFloat64(d.met.drills.WithLabelValues("not_run")); got != 1 {
		t.Errorf("drills not run = %v, want 1", got)
	}
	rec, err := s.ReadDrills(t.Context())
	if err != nil || rec == nil || rec.Last.Outcome != spec.DrillNotRun || rec.Last.Node != "n1" {
		t.Errorf("the store's drill record = %+v, %v", rec, err)
	}
}
