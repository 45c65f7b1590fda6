package backup

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// at returns a backup taken at the fake clock's now minus age.
func at(now time.Time, age time.Duration, seq int) Info {
	t := now.Add(-age)
	return Info{Name: fmt.Sprintf("%s-%06d", t.UTC().Format("2006-01-02T15:04:05Z"), seq), Meta: Meta{Timestamp: spec.Int64(t.Unix())}}
}

func TestRetention(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 30, 0, 0, time.UTC) // a fake clock
	h, d := time.Hour, 24*time.Hour
	tests := []struct {
		name      string
		policy    string
		ages      []time.Duration
		protected []int // indexes into ages
		wantGone  []int // indexes into ages
	}{
		{name: "default keeps everything under an hour", policy: "default",
			ages: []time.Duration{time.Minute, 15 * time.Minute, 59 * time.Minute}},
		{name: "default keeps one per hour for a week", policy: "default",
			ages:     []time.Duration{0, 2*h + 10*time.Minute, 2*h + 20*time.Minute, 2*h + 25*time.Minute, 3 * h},
			wantGone: []int{2, 3}},
		{name: "default keeps one per day up to 90 days, then drops", policy: "default",
			ages:     []time.Duration{0, 10*d + h, 10*d + 2*h, 91 * d},
			wantGone: []int{2, 3}},
		{name: "exponential: weekly after a week, nothing after four", policy: "exponential",
			ages:     []time.Duration{0, 20 * h, 20*h + 10*time.Minute, 3 * d, 3*d + 2*h, 10 * d, 10*d + 3*h, 29 * d},
			wantGone: []int{2, 4, 6, 7}},
		{name: "count keeps the newest N", policy: "count:2",
			ages: []time.Duration{0, time.Minute, 2 * time.Minute, 3 * time.Minute}, wantGone: []int{2, 3}},
		{name: "the newest is kept even when very old", policy: "default",
			ages: []time.Duration{200 * d, 300 * d}, wantGone: []int{1}},
		{name: "a protected backup is kept", policy: "count:1",
			ages: []time.Duration{0, time.Minute, 2 * time.Minute}, protected: []int{2}, wantGone: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRetention(tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			var infos []Info
			for i, age := range tt.ages {
				infos = append(infos, at(now, age, i+1))
			}
			protected := map[string]bool{}
			for _, i := range tt.protected {
				protected[infos[i].Name] = true
			}
			var want []string
			for _, i := range tt.wantGone {
				want = append(want, infos[i].Name)
			}
			got := r.Expired(infos, now, protected)
			if strings.Join(got, " ") != strings.Join(sortedCopy(want), " ") {
				t.Errorf("expired %v, want %v", got, sortedCopy(want))
			}
		})
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func TestParseRetentionErrors(t *testing.T) {
	for _, s := range []string{"count:0", "count:x", "forever", "count:"} {
		if _, err := ParseRetention(s); !errors.Is(err, ErrBadRetention) {
			t.Errorf("ParseRetention(%q) = %v", s, err)
		}
	}
}
