package lease

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The term the fence holds shows while it holds it, and 0 once released.
func TestFenceTermMetric(t *testing.T) {
	s := openLockStore(t)
	f := &Fence{Lock: &Lock{NodeID: "a", TTL: 10 * time.Second, Now: time.Now}, Store: func() Store { return s }}
	reg := prometheus.NewRegistry()
	f.RegisterMetrics(reg)
	value := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gathered %d families: %v", len(mfs), err)
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	if v := value(); v != 0 {
		t.Errorf("before the lock: %v", v)
	}
	term, err := f.Acquire(t.Context(), s)
	if err != nil || term == 0 {
		t.Fatalf("Acquire = %d, %v", term, err)
	}
	if v := value(); v != float64(term) {
		t.Errorf("holding term %d: %v", term, v)
	}
	if err := f.Release(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	if v := value(); v != 0 {
		t.Errorf("after the release: %v", v)
	}
}
