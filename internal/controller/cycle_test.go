package controller

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// Every observer sees the round as it went: the observation, the plan,
// the actions carried out and their outcome; one that panics is counted
// and the others still see it.
func TestCyclePublished(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	log := slog.New(slog.DiscardHandler)
	n := node.New(node.Config{}, etcdproc.Layout{Root: t.TempDir()}, etcdproc.State{NodeID: "n1"}, nil, log, func() time.Time { return now }, func() {})
	var seen []Cycle
	lp := &loop{cfg: Config{ClusterName: "main"}, log: log, now: func() time.Time { return now }, met: newMetrics(prometheus.NewRegistry()), node: n,
		env: Env{Observers: []Observer{
			func(Cycle) { panic("a broken observer") },
			func(c Cycle) { seen = append(seen, c) },
		}}}
	obs := plan.Observed{Self: plan.Node{ID: "n1", Healthy: true}}
	warn := plan.Report{Level: slog.LevelWarn, Msg: "a warning", Status: "the cluster is short of a member"}
	start := plan.StartEtcd{}
	failed := errors.New("etcd did not start")
	lp.publishCycle(obs, now, []plan.Action{warn, start}, []Result{{Action: start, Err: failed}}, true)

	if len(seen) != 1 {
		t.Fatalf("the second observer saw %d cycles, want 1", len(seen))
	}
	c := seen[0]
	if !c.Done || c.Observed.Self.ID != "n1" || len(c.Actions) != 2 || len(c.Results) != 1 || !errors.Is(c.Results[0].Err, failed) {
		t.Errorf("cycle = %+v", c)
	}
	if c.Facts.Cluster != "main" || c.Facts.Node != "n1" || len(c.Facts.Warnings) != 1 || !c.Facts.Now.Equal(now) || !slices.Equal(c.Facts.Warnings, plan.StatusLines([]plan.Action{warn})) {
		t.Errorf("facts = %+v", c.Facts)
	}
	if got := testutil.ToFloat64(lp.met.panics); got != 1 {
		t.Errorf("panics counted = %v, want 1", got)
	}
}

// An Env that lacks what the loop cannot run without is refused, naming
// what is missing, rather than a nil dereference in some later cycle.
func TestEnvCheck(t *testing.T) {
	err := Env{Log: slog.New(slog.DiscardHandler), Now: time.Now}.check()
	if err == nil || !strings.Contains(err.Error(), "Announced, Certs, Registry, Wake") {
		t.Errorf("check = %v", err)
	}
	wake := make(chan struct{})
	full := Env{Log: slog.New(slog.DiscardHandler), Now: time.Now, Registry: prometheus.NewRegistry(), Certs: noCerts{},
		Wake: wake, Announced: func() map[string]bool { return nil }}
	if err := full.check(); err != nil {
		t.Errorf("check of a whole Env = %v", err)
	}
}

type noCerts struct{}

func (noCerts) Marker() string       { return "" }
func (noCerts) Trust() []string      { return nil }
func (noCerts) Info() *peer.CertInfo { return nil }
