package operator

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
)

// execReply is an Execer that answers every command with out and err.
type execReply struct {
	out []byte
	err error
}

func (e execReply) Exec(context.Context, string, string, string, []string) ([]byte, error) {
	return e.out, e.err
}

// What the ctl's get says maps to what the reconciler does with it: no
// spec and an invalid one are both written afresh from the EtcdCluster.
func TestCtlSpec(t *testing.T) {
	cl := &v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "ns"}}
	for _, tc := range []struct {
		name    string
		reply   execReply
		want    error
		members int32
	}{
		{"a spec", execReply{out: []byte(`{"memberCount":3,"etcdVersion":"3.6.16"}`)}, nil, 3},
		{"no spec", execReply{err: errors.New(`operator: get in ns/main-0: exit 1: no cluster spec in file:///var/etcd/backups; configure-cluster writes one`)}, ErrNoSpec, 0},
		{"an invalid spec", execReply{err: errors.New(`operator: get in ns/main-0: exit 1: the cluster spec in file:///b (control/etcd-cluster-spec) is invalid: spec: member count 0 must be at least 1; the agents ignore it`)}, ErrInvalidSpec, 0},
		{"another failure", execReply{err: errors.New(`operator: get in ns/main-0: container not found`)}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := Ctl{Exec: tc.reply}.Spec(t.Context(), cl, "main-0")
			switch {
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("got %v, want %v", err, tc.want)
			case tc.want == nil && tc.reply.err != nil && (err == nil || errors.Is(err, ErrNoSpec) || errors.Is(err, ErrInvalidSpec)):
				t.Fatalf("got %v, want the exec's error as it is", err)
			case tc.members > 0 && (err != nil || cs == nil || cs.MemberCount != tc.members):
				t.Fatalf("got %+v, %v; want %d members", cs, err, tc.members)
			}
		})
	}
}

// A restore the ctl refuses for the backup itself fails the EtcdRestore;
// any other failure is retried.
func TestCtlRestoreBackupRefused(t *testing.T) {
	cl := &v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "ns"}}
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"not whole", errors.New("operator: restore-backup in ns/main-0: exit 1: backup 2026-01-01T00:00:00Z-000001 in s3://b/p is not whole: it has no etcd.backup.gz"), true},
		{"corrupt meta", errors.New("operator: restore-backup in ns/main-0: exit 1: backup 2026-01-01T00:00:00Z-000001 cannot be restored: backup: snapshot is corrupt"), true},
		{"gone", errors.New(`operator: restore-backup in ns/main-0: exit 1: no backup "2026-01-01T00:00:00Z-000001" in s3://b/p`), true},
		{"the store is down", errors.New("operator: restore-backup in ns/main-0: exit 1: store: backup store unreachable"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Ctl{Exec: execReply{err: tc.err}}.RestoreBackup(t.Context(), cl, "main-0", "2026-01-01T00:00:00Z-000001")
			if got := errors.Is(err, ErrBackupRefused); got != tc.refused {
				t.Fatalf("%v: refused = %v, want %v", err, got, tc.refused)
			}
		})
	}
}
