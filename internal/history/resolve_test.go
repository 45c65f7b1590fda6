package history

import (
	"strings"
	"testing"
	"time"
)

func TestTargetValidate(t *testing.T) {
	at := time.Date(2026, 11, 22, 5, 7, 30, 0, time.UTC)
	for _, c := range []struct {
		name   string
		target Target
		set    bool
		err    string
	}{
		{"none", Target{}, false, ""},
		{"the newest point", Target{Latest: true}, true, ""},
		{"a revision", Target{Revision: 7}, true, ""},
		{"a time on a timeline", Target{Time: at, Timeline: "tl1"}, true, ""},
		{"two points", Target{Latest: true, Revision: 7}, true, "not more than one"},
		{"all three", Target{Latest: true, Revision: 7, Time: at}, true, "not more than one"},
		{"a revision before the first", Target{Revision: -1}, true, "revisions start at 1"},
		{"a timeline alone", Target{Timeline: "tl1"}, false, "without a point"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.target.Set(); got != c.set {
				t.Errorf("Set() = %v, want %v", got, c.set)
			}
			err := c.target.Validate()
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Errorf("Validate() = %v, want %q", err, c.err)
			}
		})
	}
}

func TestTargetString(t *testing.T) {
	at := time.Date(2026, 11, 22, 6, 7, 30, 0, time.FixedZone("CET", 3600))
	if got, want := (Target{Time: at}).String(), "--to-time 2026-11-22T05:07:30Z"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := (Target{Revision: 42}).String(), "revision 42"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
