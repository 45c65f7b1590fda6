package procedure

import (
	"errors"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The fresh backup of a restored cluster is taken from a healthy member
// of that cluster; while none is, the step waits rather than fails.
func TestRestoredEndpoint(t *testing.T) {
	member := func(token string, quarantined bool) *plan.Membership {
		return &plan.Membership{ClusterToken: token, Quarantined: quarantined}
	}
	tests := []struct {
		name  string
		peers []plan.Node
		want  string
		wait  bool
		fails bool
	}{
		{name: "a healthy member serves clients", want: "https://b:2379", peers: []plan.Node{
			{ID: "a", Member: member("new", false), ClientURLs: []string{"https://a:2379"}},
			{ID: "b", Healthy: true, Member: member("new", false), ClientURLs: []string{"https://b:2379"}},
		}},
		{name: "a quarantined member", want: "https://a:3994", peers: []plan.Node{
			{ID: "a", Healthy: true, Member: member("new", true), ClientURLs: []string{"https://a:2379"}, QuarantineURLs: []string{"https://a:3994"}},
		}},
		{name: "members still starting", wait: true, peers: []plan.Node{
			{ID: "a", Member: member("new", false), ClientURLs: []string{"https://a:2379"}},
			{ID: "b"},
		}},
		{name: "only the old cluster answers", wait: true, peers: []plan.Node{
			{ID: "a", Healthy: true, Member: member("old", false), ClientURLs: []string{"https://a:2379"}},
		}},
		{name: "a node outside the restore", wait: true, peers: []plan.Node{
			{ID: "z", Healthy: true, Member: member("new", false), ClientURLs: []string{"https://z:2379"}},
		}},
		{name: "quarantined without a quarantine URL", fails: true, peers: []plan.Node{
			{ID: "a", Healthy: true, Member: member("new", true)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := restoredEndpoint(tt.peers, &spec.RestoreProgress{Token: "new", Members: []string{"a", "b"}})
			switch {
			case tt.wait:
				if !errors.Is(err, ErrWait) {
					t.Fatalf("got %q, %v; want it to wait", got, err)
				}
			case tt.fails:
				if err == nil || errors.Is(err, ErrWait) {
					t.Fatalf("got %q, %v; want a failure", got, err)
				}
			case err != nil || got != tt.want:
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// A restore says whether what it restores was checked against etcd: a
// backup as it is, or one brought forward whose result matched a digest
// capture read from etcd, is verified; one brought forward with no digest
// in range is not.
func TestRestoreCheck(t *testing.T) {
	point := spec.RestorePoint{ToRevision: 90, Timeline: "t"}
	tests := []struct {
		name  string
		point spec.RestorePoint
		v     Validated
		want  string
		how   string
	}{
		{"the backup alone", spec.RestorePoint{}, Validated{}, spec.RestoreVerified, "the backup's snapshot as etcd wrote it"},
		{"a point at the backup's own revision", point, Validated{}, spec.RestoreVerified, "the backup's snapshot"},
		{"brought forward, a digest in range", point, Validated{Forward: true, Digest: 80}, spec.RestoreVerified, "matched, at revision 80, the digest"},
		{"brought forward, no digest in range", point, Validated{Forward: true}, spec.RestoreUnverified, "no digest between the backup and revision 90"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, how := restoreCheck(tt.point, tt.v)
			if got != tt.want || !strings.Contains(how, tt.how) {
				t.Errorf("restoreCheck = %s (%s), want %s (%s)", got, how, tt.want, tt.how)
			}
		})
	}
}
