package spec

import (
	"errors"
	"testing"
	"time"
)

func TestParseCompaction(t *testing.T) {
	tests := []struct {
		mode, retention string
		want            CompactionPolicy
		wantErr         bool
	}{
		{"", "", CompactionPolicy{Period: time.Hour}, false},
		{"periodic", "", CompactionPolicy{Period: time.Hour}, false},
		{"periodic", "30m", CompactionPolicy{Period: 30 * time.Minute}, false},
		{"periodic", "72", CompactionPolicy{Period: 72 * time.Hour}, false}, // hours, as etcd reads it
		{"periodic", " 5m ", CompactionPolicy{Period: 5 * time.Minute}, false},
		{"periodic", "0", CompactionPolicy{}, false},
		{"periodic", "0s", CompactionPolicy{}, false},
		{"revision", "1000", CompactionPolicy{Revisions: 1000}, false},
		{"revision", "0", CompactionPolicy{}, false},
		{"periodic", "-1h", CompactionPolicy{}, true},
		{"periodic", "-3", CompactionPolicy{}, true},
		{"periodic", "100ms", CompactionPolicy{}, true},
		{"periodic", "200000", CompactionPolicy{}, true},
		{"periodic", "soon", CompactionPolicy{}, true},
		{"revision", "", CompactionPolicy{}, true},
		{"revision", "1h", CompactionPolicy{}, true},
		{"revision", "-5", CompactionPolicy{}, true},
		{"revision", "99999999999999999999", CompactionPolicy{}, true},
		{"Periodic", "1h", CompactionPolicy{}, true},
		{"hourly", "1", CompactionPolicy{}, true},
	}
	for _, tt := range tests {
		got, err := ParseCompaction(tt.mode, tt.retention)
		if tt.wantErr {
			if !errors.Is(err, ErrInvalidCompaction) {
				t.Errorf("ParseCompaction(%q, %q) = %+v, %v; want ErrInvalidCompaction", tt.mode, tt.retention, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseCompaction(%q, %q) = %+v, %v; want %+v", tt.mode, tt.retention, got, err, tt.want)
		}
	}
}

func TestSpecValidateCompaction(t *testing.T) {
	base := ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}
	bad := base
	bad.AutoCompactionMode = "sometimes"
	if _, err := bad.Validate(); !errors.Is(err, ErrInvalidCompaction) {
		t.Errorf("a spec with compaction mode %q validated: %v", bad.AutoCompactionMode, err)
	}
	short := base
	short.AutoCompactionMode, short.AutoCompactionRetention = "revision", "10"
	if w, err := short.Validate(); err != nil || len(w) != 1 {
		t.Errorf("a spec keeping 10 revisions: warnings %q, %v; want one warning", w, err)
	}
	if w, err := base.Validate(); err != nil || len(w) != 0 {
		t.Errorf("the default policy: warnings %q, %v", w, err)
	}
}
