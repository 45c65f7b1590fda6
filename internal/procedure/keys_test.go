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
			got := lackingKeys(obs, tt.members, tt.keys)
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
