package capture

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/etcd-manager/etcd-manager/internal/changelog"
)

// Capture that needs a full backup to start from waits for one begun no
// earlier than the need (to the second, as backup times go), or for one
// of its own agent's.
func TestWaitForABase(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 500_000_000, time.UTC)
	cfg := changelog.Default()
	cfg.Enabled = true
	reg := prometheus.NewRegistry()
	c := New(cfg, t.TempDir(), "file:///nowhere", slog.New(slog.DiscardHandler), func() time.Time { return now }, reg)
	if c.NeedsBase() {
		t.Fatal("a fresh capturer waits for a base")
	}
	c.RequestBase()
	if !c.NeedsBase() {
		t.Fatal("RequestBase did not make it wait")
	}
	c.BaseStored(now.Add(-time.Second))
	if !c.NeedsBase() {
		t.Error("a backup begun before the need served as its base")
	}
	c.BaseStored(now.Truncate(time.Second))
	if c.NeedsBase() {
		t.Error("a backup begun in the second of the need did not serve")
	}
	c.RequestBase()
	c.BackedUp()
	if c.NeedsBase() {
		t.Error("the agent's own backup did not serve")
	}
	// Its spool is not open yet: it follows nothing, and knows no durable
	// revision.
	c.Follow(true, "token", []string{"http://127.0.0.1:1"}, nil, false)
	if c.run != nil {
		t.Error("capture started with no store")
	}
	if rev, on := c.Durable("token"); rev != 0 || !on {
		t.Errorf("Durable = %d, %v; want 0, true", rev, on)
	}
	if n, err := testutil.GatherAndCount(reg, "etcd_manager_capture_enabled", "etcd_manager_capture_running"); err != nil || n != 2 {
		t.Errorf("capture's metrics: %d series, %v", n, err)
	}
}

// With capture off, compaction need not wait for it.
func TestDurableWhenOff(t *testing.T) {
	cfg := changelog.Default()
	cfg.Enabled = false
	c := New(cfg, t.TempDir(), "file:///nowhere", slog.New(slog.DiscardHandler), time.Now, prometheus.NewRegistry())
	if rev, on := c.Durable("token"); rev != 0 || on {
		t.Errorf("Durable = %d, %v; want 0, false", rev, on)
	}
}
