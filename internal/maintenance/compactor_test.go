package maintenance

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The executor: samples, holds, overtakes once, and asks capture for a
// base when it does.
func TestCompactorCheck(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	c := NewCompactor(CompactionConfig{Interval: time.Second, CaptureWait: 10 * time.Second, QuotaShare: 0.5},
		slog.New(slog.NewTextHandler(&logs, nil)), func() time.Time { return now }, prometheus.NewRegistry())
	c.reset("tok")
	cl := &fakeCompaction{head: 1000}
	cf := &fakeFloor{rev: 950, on: true}
	policy := spec.CompactionPolicy{Revisions: 100}

	c.check(t.Context(), cl, cf, policy)
	if len(cl.compacted) != 1 || cl.compacted[0] != 900 || c.heldSince != (time.Time{}) {
		t.Fatalf("capture ahead: compacted %v, held since %v", cl.compacted, c.heldSince)
	}
	// Capture stalls at 1100 while the head runs on.
	cf.rev, cl.head = 1100, 1500
	now = now.Add(time.Second)
	c.check(t.Context(), cl, cf, policy)
	if got := cl.compacted[len(cl.compacted)-1]; got != 1101 || c.heldSince != now {
		t.Fatalf("capture behind: compacted to %d (want 1101, what capture stored), held since %v", got, c.heldSince)
	}
	now = now.Add(5 * time.Second)
	cl.head = 1600
	c.check(t.Context(), cl, cf, policy)
	if n := len(cl.compacted); n != 2 || cf.requested {
		t.Fatalf("held 5s of 10: compactions %v, base requested %v", cl.compacted, cf.requested)
	}
	now = now.Add(5 * time.Second)
	c.check(t.Context(), cl, cf, policy)
	if got := cl.compacted[len(cl.compacted)-1]; got != 1500 || !cf.requested || !c.heldSince.IsZero() {
		t.Fatalf("held 10s: compacted to %d (want 1500), base requested %v, held since %v", got, cf.requested, c.heldSince)
	}
	if !strings.Contains(logs.String(), "compaction went past continuous capture") {
		t.Errorf("the overtake was not logged:\n%s", logs.String())
	}
	// Capture that moves, however far behind, is waited for: no
	// overtake however long it trails.
	cf.rev, cl.head, cf.requested = 1600, 1800, false
	for range 30 {
		now = now.Add(time.Second)
		cf.rev += 10
		cl.head += 100
		c.check(t.Context(), cl, cf, policy)
		if got := cl.compacted[len(cl.compacted)-1]; got != cf.rev+1 || cf.requested {
			t.Fatalf("capture moving to %d: compacted to %d, base requested %v", cf.rev, got, cf.requested)
		}
	}
	// A client compacted further already: nothing is counted against
	// capture.
	cl.err = rpctypes.ErrCompacted
	cl.head += 100
	now = now.Add(time.Minute)
	c.check(t.Context(), cl, cf, policy)
	if cf.requested || strings.Count(logs.String(), "compaction went past continuous capture") != 1 {
		t.Errorf("a client's compaction counted as an overtake:\n%s", logs.String())
	}
	// A failed compaction is tried again at the next check.
	compacted := c.compacted
	cl.err = errors.New("etcdserver: request timed out")
	cl.head += 100
	cf.rev += 10
	now = now.Add(time.Second)
	c.check(t.Context(), cl, cf, spec.CompactionPolicy{Revisions: 100})
	if c.compacted != compacted {
		t.Errorf("a failed compaction recorded %d as compacted (was %d)", c.compacted, compacted)
	}
}

// fakeCompaction records the compactions asked for.
type fakeCompaction struct {
	head      int64
	err       error
	compacted []int64
}

func (f *fakeCompaction) Status(context.Context) (int64, int64, error) { return f.head, 1 << 20, nil }

func (f *fakeCompaction) Compact(_ context.Context, rev int64) error {
	if f.err != nil {
		return f.err
	}
	f.compacted = append(f.compacted, rev)
	return nil
}

type fakeFloor struct {
	rev       int64
	on        bool
	requested bool
}

func (f *fakeFloor) Durable(string) (int64, bool) { return f.rev, f.on }
func (f *fakeFloor) RequestBase()                 { f.requested = true }

func TestBackendQuota(t *testing.T) {
	quota := func(q string) spec.Settings {
		if q == "" {
			return nil
		}
		return spec.Settings{"quota-backend-bytes": q}
	}
	tests := []struct {
		name          string
		spec, running string
		noMember      bool
		want          int64
	}{
		{"etcd's default", "", "", false, spec.DefaultQuotaBytes},
		{"the spec's, rolled out", "33554432", "33554432", false, 32 << 20},
		{"raised in the spec, not yet rolled out: the running one", "8589934592", "", false, spec.DefaultQuotaBytes},
		{"lowered in the spec, not yet rolled out: the spec's", "33554432", "", false, 32 << 20},
		{"no membership: the spec's", "8589934592", "", true, 8 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m *plan.Membership
			if !tt.noMember {
				m = &plan.Membership{Settings: quota(tt.running)}
			}
			if got := backendQuota(spec.ClusterSpec{EtcdSettings: quota(tt.spec)}, m); got != tt.want {
				t.Errorf("backendQuota = %d, want %d", got, tt.want)
			}
		})
	}
}
