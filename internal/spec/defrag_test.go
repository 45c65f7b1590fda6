package spec

import (
	"strings"
	"testing"
	"time"
)

func TestDefragDue(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name               string
		p                  *DefragPolicy
		db, inUse, quota   int64
		wantDue            bool
		wantReasonContains string
	}{
		{"defaults: most of it free", nil, 500 * mib, 100 * mib, 0, true, "at least 50%"},
		{"defaults: too little free to bother", nil, 100 * mib, 60 * mib, 0, false, ""},
		{"defaults: a big share but under the byte floor", nil, 40 * mib, 1 * mib, 0, false, ""},
		{"defaults: a small share of a database near its quota", nil, 1800 * mib, 1600 * mib, 0, true, "80% or more of the quota"},
		{"a larger quota: not near it", nil, 1800 * mib, 1600 * mib, 8 << 30, false, ""},
		{"a custom policy", &DefragPolicy{MinReclaimableBytes: mib, MinReclaimableFraction: 0.1}, 20 * mib, 17 * mib, 0, true, "at least 10%"},
		{"nothing reported yet", nil, 0, 0, 0, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			why := tt.p.Effective().DefragDue(tt.db, tt.inUse, tt.quota)
			if (why != "") != tt.wantDue || !strings.Contains(why, tt.wantReasonContains) {
				t.Fatalf("due %q, want due=%v mentioning %q", why, tt.wantDue, tt.wantReasonContains)
			}
		})
	}
}

func TestDefragWindow(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	nightly := DefragPolicy{Window: "0 3 * * *", WindowDuration: "2h"}
	tests := []struct {
		p    DefragPolicy
		now  string
		open bool
	}{
		{DefragPolicy{}, "2026-11-23T12:00:00Z", true},
		{nightly, "2026-11-23T03:00:00Z", true},
		{nightly, "2026-11-23T04:59:00Z", true},
		{nightly, "2026-11-23T05:01:00Z", false},
		{nightly, "2026-11-23T02:59:00Z", false},
		{DefragPolicy{Window: "0 3 * * SUN"}, "2026-11-22T03:30:00Z", true}, // a Sunday, default 1h
		{DefragPolicy{Window: "0 3 * * SUN"}, "2026-11-23T03:30:00Z", false},
	}
	for _, tt := range tests {
		if got := tt.p.Open(at(tt.now)); got != tt.open {
			t.Errorf("window %q for %q at %s: open %v, want %v", tt.p.Window, tt.p.WindowDuration, tt.now, got, tt.open)
		}
	}
	for _, bad := range []DefragPolicy{{Window: "at 3"}, {Window: "TZ=x"}, {Window: "CRON_TZ=Europe/Paris 0 3 * * *"}, {Window: "0 3 * * *", WindowDuration: "10s"}, {MinReclaimableFraction: 1.5}, {QuotaPercent: 101}, {MinReclaimableBytes: -1}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
