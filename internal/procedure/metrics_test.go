package procedure

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The phase metric has one series, for what the agent drives now, and
// none while it drives nothing; steps count by result.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	phase := func(want string) {
		t.Helper()
		head := "# HELP etcd_manager_procedure_phase 1 for the procedure and phase this agent drives now; no series while it drives none.\n# TYPE etcd_manager_procedure_phase gauge\n"
		if want == "" {
			head = ""
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(head+want), "etcd_manager_procedure_phase"); err != nil {
			t.Error(err)
		}
	}
	phase("")
	m.running("restore", "stopping")
	phase(`etcd_manager_procedure_phase{phase="stopping",procedure="restore"} 1` + "\n")
	m.running("restore", "restoring")
	phase(`etcd_manager_procedure_phase{phase="restoring",procedure="restore"} 1` + "\n")
	m.idle()
	phase("")

	m.step("restore", "stopping", nil)
	m.step("restore", "stopping", nil)
	m.step("restore", "restoring", errors.New("boom"))
	m.step("restore", "restoring", fmt.Errorf("%w: members still starting", ErrWait))
	if got := testutil.ToFloat64(m.steps.WithLabelValues("restore", "stopping", "ok")); got != 2 {
		t.Errorf("ok steps %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.steps.WithLabelValues("restore", "restoring", "error")); got != 1 {
		t.Errorf("failed steps %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.steps.WithLabelValues("restore", "restoring", "wait")); got != 1 {
		t.Errorf("waiting steps %v, want 1", got)
	}
	var none *Metrics // a runner without metrics
	none.running("restore", "stopping")
	none.idle()
	none.step("restore", "stopping", nil)
}
