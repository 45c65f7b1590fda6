package procedure

import (
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// A restore is refused before anything stops when a node that would
// restore lacks a key the backup or its segments need.
func TestLackingKeys(t *testing.T) {
	obs := plan.Observed{Peers: []plan.Node{
		{ID: "a", BackupKeys: []string{"age:aaaaaaaaaaaaaaaa", "age:0000000000000000"}},
		{ID: "b", BackupKeys: []string{"age:bbbbbbbbbbbbbbbb"}},
		{ID: "c"},
		{ID: "zz"}, // not a member of the restored cluster
	}}
	tests := []struct {
		name    string
		members []string
		keys    []string
		want    []string // "" when nothing lacks
	}{
		{name: "plaintext", members: []string{"a", "b", "c"}},
		{name: "every member holds it", members: []string{"a"}, keys: []string{"age:aaaaaaaaaaaaaaaa"}},
		{name: "some lack it", members: []string{"a", "b", "c"}, keys: []string{"age:aaaaaaaaaaaaaaaa"},
			want: []string{"it is encrypted with key age:aaaaaaaaaaaaaaaa, which the agents of b, c do not hold", "b holds [age:bbbbbbbbbbbbbbbb]", "c holds no key"}},
		{name: "two keys", members: []string{"a", "b"}, keys: []string{"age:aaaaaaaaaaaaaaaa", "age:bbbbbbbbbbbbbbbb"},
			want: []string{"key age:aaaaaaaaaaaaaaaa, which the agents of b do not hold", "key age:bbbbbbbbbbbbbbbb, which the agents of a do not hold"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := lackingKeys(obs.Peers, tt.members, tt.keys)
			if len(tt.want) == 0 {
				if got != "" {
					t.Fatalf("lackingKeys = %q, want none", got)
				}
				return
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			if strings.Contains(got, "zz") {
				t.Errorf("%q names a node that does not restore", got)
			}
		})
	}
}

// A restore is refused before anything stops when a node that would
// restore reports less room than the snapshot needs; a node that
// reports none (an older agent) and a meta without a size are not
// judged.
func TestLackingRoom(t *testing.T) {
	obs := plan.Observed{Peers: []plan.Node{
		{ID: "a", RestoreRoom: 1 << 30},
		{ID: "b", RestoreRoom: 1 << 20},
		{ID: "c"},
		{ID: "zz", RestoreRoom: 1}, // not a member of the restored cluster
	}}
	tests := []struct {
		name    string
		members []string
		size    int64
		want    string // "" when none lacks room
	}{
		{"room on every member", []string{"a", "b", "c"}, 1 << 20, ""},
		{"a size no meta recorded", []string{"a", "b", "c"}, 0, ""},
		{"one member short", []string{"a", "b", "c"}, 1<<20 + 1, "its snapshot is 1048577 bytes, and b has room for 1048576"},
		{"both short", []string{"a", "b"}, 1<<30 + 1, "a has room for 1073741824, b has room for 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := lackingRoom(obs.Peers, tt.members, tt.size)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("lackingRoom = %q, want %q", got, tt.want)
			}
			if strings.Contains(got, "zz") || strings.Contains(got, "c has") {
				t.Errorf("%q names a node it should not judge", got)
			}
		})
	}
}
