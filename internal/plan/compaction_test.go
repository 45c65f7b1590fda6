package plan

import (
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanCompaction(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	hour := spec.CompactionPolicy{Period: time.Hour}
	samples := []RevisionSample{{at(0), 100}, {at(30 * time.Minute), 500}, {at(70 * time.Minute), 900}, {at(90 * time.Minute), 1000}}
	keep100 := spec.CompactionPolicy{Revisions: 100}
	tests := []struct {
		name string
		in   CompactionInput
		want CompactionDecision
	}{
		{"periodic: the newest sample an hour old",
			CompactionInput{Policy: hour, Now: at(95 * time.Minute), Head: 1010, Samples: samples},
			CompactionDecision{Revision: 500, Wanted: 500}},
		{"periodic: no sample old enough yet",
			CompactionInput{Policy: hour, Now: at(50 * time.Minute), Head: 1010, Samples: samples},
			CompactionDecision{}},
		{"periodic: already compacted that far",
			CompactionInput{Policy: hour, Now: at(95 * time.Minute), Head: 1010, Samples: samples, Compacted: 500},
			CompactionDecision{}},
		{"revision: the head less the count",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000},
			CompactionDecision{Revision: 900, Wanted: 900}},
		{"revision: fewer revisions than the count",
			CompactionInput{Policy: keep100, Now: t0, Head: 80},
			CompactionDecision{}},
		{"off",
			CompactionInput{Now: t0, Head: 1000, Samples: samples},
			CompactionDecision{}},
		{"capture ahead: the policy's revision",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Capture: true, Captured: 999, CaptureWait: time.Minute, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Revision: 900, Wanted: 900}},
		{"capture exactly at the floor",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Capture: true, Captured: 899, CaptureWait: time.Minute, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Revision: 900, Wanted: 900}},
		{"capture behind: up to what it stored, no further",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Capture: true, Captured: 600, CaptureWait: time.Minute, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Revision: 601, Wanted: 900, Held: true}},
		{"capture behind, already compacted to what it stored",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Compacted: 601, Capture: true, Captured: 600, HeldSince: t0.Add(-30 * time.Second), CaptureWait: time.Minute, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Wanted: 900, Held: true}},
		{"capture has stored nothing yet",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Capture: true, CaptureWait: time.Minute, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Wanted: 900, Held: true}},
		{"capture stalled too long: availability wins",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Compacted: 601, Capture: true, Captured: 600, Stalled: true, HeldSince: t0.Add(-time.Minute), CaptureWait: time.Minute, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Revision: 900, Wanted: 900, Held: true, Overtake: "capture has made no progress for 1m0s"}},
		{"capture stalled, the database nears its quota: availability wins at once",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Capture: true, Captured: 600, Stalled: true, CaptureWait: time.Minute, DBInUse: 600 << 20, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Revision: 900, Wanted: 900, Held: true, Overtake: "capture is stalled and the database's 629145600 bytes in use reach 59% of its 1073741824-byte quota"}},
		{"capture behind but moving, the database near its quota: it waits",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Compacted: 601, Capture: true, Captured: 700, CaptureWait: time.Minute, DBInUse: 600 << 20, Quota: 1 << 30, QuotaShare: 0.5},
			CompactionDecision{Revision: 701, Wanted: 900, Held: true}},
		{"capture off: compaction never waits",
			CompactionInput{Policy: keep100, Now: t0, Head: 1000, Captured: 10},
			CompactionDecision{Revision: 900, Wanted: 900}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PlanCompaction(tt.in); got != tt.want {
				t.Errorf("PlanCompaction = %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
