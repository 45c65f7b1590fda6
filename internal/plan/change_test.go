package plan

import (
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestSpecChanges(t *testing.T) {
	base := spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.5.35", EtcdSettings: spec.Settings{"snapshot-count": "10000"}}
	with := func(f func(*spec.ClusterSpec)) spec.ClusterSpec {
		c := base
		c.EtcdSettings = base.EtcdSettings.Clone()
		f(&c)
		return c
	}
	v := func(s string) spec.Version { x, _ := spec.ParseVersion(s); return x }
	tests := []struct {
		name      string
		cur       *spec.ClusterSpec
		next      spec.ClusterSpec
		installed []spec.Version
		want      []string // field: a part of how
		refused   bool
	}{
		{name: "new cluster", next: base, want: []string{"cluster: a new cluster: the agents create 3 member(s) of etcd 3.5.35"}},
		{name: "no change", cur: &base, next: base},
		{name: "grow", cur: &base, next: with(func(c *spec.ClusterSpec) { c.MemberCount = 5 }), want: []string{"memberCount: the leader adds 2 member(s) one at a time"}},
		{name: "shrink ordinal", cur: &base, next: with(func(c *spec.ClusterSpec) { c.MemberCount, c.OrdinalMembers = 1, true }),
			want: []string{"memberCount: the leader removes 2 member(s) one at a time (the highest ordinal first)", "ordinalMembers: which nodes"}},
		{name: "one minor up", cur: &base, next: with(func(c *spec.ClusterSpec) { c.EtcdVersion = "3.6.16" }),
			want: []string{"etcdVersion: each member restarts on etcd 3.6.16, one member at a time"}},
		{name: "two minors up, through the one installed", cur: &base, next: with(func(c *spec.ClusterSpec) { c.EtcdVersion = "3.7.3" }),
			installed: []spec.Version{v("3.5.35"), v("3.6.16"), v("3.7.3")},
			want:      []string{"etcdVersion: each member restarts on etcd 3.6.16, one member at a time, followers first, leadership handed off each member before its etcd restarts; each waits until every member is healthy; then each member restarts on etcd 3.7.3"}},
		{name: "two minors up, the one between missing", cur: &base, next: with(func(c *spec.ClusterSpec) { c.EtcdVersion = "3.7.3" }),
			want: []string{"etcdVersion: steps through 3.6, but no 3.6.x is installed on every node"}, refused: true},
		{name: "in-place downgrade", cur: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}, next: spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.5.35"},
			want: []string{"etcdVersion: etcd's downgrade to 3.5 is enabled, then each member restarts on etcd 3.5.35"}},
		{name: "down without dump-restore is refused", cur: &base, next: with(func(c *spec.ClusterSpec) { c.EtcdVersion = "3.4.23" }),
			want: []string{"etcdVersion: going from 3.5.35 down to 3.4.23 needs dump and restore"}, refused: true},
		{name: "dump-restore allowed", cur: &base, next: with(func(c *spec.ClusterSpec) { c.EtcdVersion, c.AllowDumpRestore = "3.4.23", true }),
			want: []string{"etcdVersion: the cluster is quarantined and backed up, and replaced by a new cluster of etcd 3.4.23"}},
		{name: "settings", cur: &base, next: with(func(c *spec.ClusterSpec) {
			delete(c.EtcdSettings, "snapshot-count")
			c.EtcdSettings["quota-backend-bytes"] = "8589934592"
		}), want: []string{"etcdSettings.quota-backend-bytes: each member's etcd restarts with it", "etcdSettings.snapshot-count: each member's etcd restarts"}},
		{name: "compaction and defrag", cur: &base, next: with(func(c *spec.ClusterSpec) {
			c.AutoCompactionMode, c.AutoCompactionRetention = spec.CompactionRevision, "1000"
			c.Defrag = &spec.DefragPolicy{Off: true}
		}), want: []string{"compaction: the leader compacts by it", "defrag: the leader defragments by it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SpecChanges(tt.cur, tt.next, tt.installed)
			if len(got) != len(tt.want) {
				t.Fatalf("%d changes %+v, want %d", len(got), got, len(tt.want))
			}
			for i, w := range tt.want {
				field, how, _ := strings.Cut(w, ": ")
				if got[i].Field != field || !strings.Contains(got[i].How, how) {
					t.Errorf("change %d = %+v, want %s: ...%s...", i, got[i], field, how)
				}
			}
			if tt.refused != (len(got) > 0 && slicesAnyRefused(got)) {
				t.Errorf("refused = %v, want %v: %+v", !tt.refused, tt.refused, got)
			}
		})
	}
}

func slicesAnyRefused(cs []SpecChange) bool {
	for _, c := range cs {
		if c.Refused {
			return true
		}
	}
	return false
}
