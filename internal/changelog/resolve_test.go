package changelog

import (
	"slices"
	"testing"
)

// What the kept backups reach through the runs, not what the runs hold.
func TestReachable(t *testing.T) {
	// Run 1 from a backup at 10 to 95; capture stopped, started again
	// after a backup at 100, and ran to 900.
	runs := []Run{{First: 11, Last: 95}, {First: 101, Last: 900}}
	tests := []struct {
		name    string
		backups []int64
		want    []Span
	}{
		{name: "every base kept", backups: []int64{10, 100, 500}, want: []Span{{10, 95}, {100, 900}}},
		{name: "the second run's base removed: reachable from the kept backup inside it",
			backups: []int64{10, 500}, want: []Span{{10, 95}, {500, 900}}},
		{name: "the first run's base removed", backups: []int64{50, 100}, want: []Span{{50, 95}, {100, 900}}},
		{name: "only the newest kept", backups: []int64{900}, want: []Span{{900, 900}}},
		{name: "a backup beyond every run", backups: []int64{10, 950}, want: []Span{{10, 95}, {950, 950}}},
		{name: "a backup in a run's gap joins the next run", backups: []int64{97, 98, 100}, want: []Span{{97, 98}, {100, 900}}},
		{name: "in any order", backups: []int64{500, 10}, want: []Span{{10, 95}, {500, 900}}},
		{name: "no backup, nothing reachable", backups: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Reachable(runs, tt.backups)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Reachable(%v) = %v, want %v", tt.backups, got, tt.want)
			}
		})
	}
	if got, want := Holes([]Span{{10, 95}, {500, 900}}), []Gap{{After: 95, Before: 500}}; !slices.Equal(got, want) {
		t.Errorf("Holes = %v, want %v", got, want)
	}
}
