package storeops

import (
	"errors"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), "file://"+t.TempDir()+"/store", store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// One store, one owner: the first writer owns it, another is refused and
// changes nothing, unless it takes the store over on purpose.
func TestWriteOwnedSpec(t *testing.T) {
	ctx := t.Context()
	a := spec.ClusterOwner{Kind: spec.OwnerKindEtcdCluster, Namespace: "db", Name: "main", UID: "u1"}
	b := spec.ClusterOwner{Kind: spec.OwnerKindEtcdCluster, Namespace: "db", Name: "copy", UID: "u2"}
	three := spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true, EtcdSettings: spec.Settings{"snapshot-count": "5000"}}
	five := spec.ClusterSpec{MemberCount: 5, EtcdVersion: "3.6.16", OrdinalMembers: true}

	type step struct {
		name  string
		spec  spec.ClusterSpec
		owner spec.ClusterOwner
		claim Claim
		want  error
		// after: the store's spec member count and owner afterwards
		count int32
		own   string
	}
	for _, tc := range []struct {
		name    string
		preSpec bool // a spec with no owner record, as etcd-manager-ctl writes
		steps   []step
	}{
		{name: "a fresh store, then another cluster", steps: []step{
			{name: "first write owns it", spec: three, owner: a, count: 3, own: "main"},
			{name: "the same again", spec: three, owner: a, count: 3, own: "main"},
			{name: "another is refused", spec: five, owner: b, want: ErrStoreInUse, count: 3, own: "main"},
			{name: "the same name made again (a new UID) keeps it", spec: three, owner: spec.ClusterOwner{Kind: a.Kind, Namespace: "db", Name: "main", UID: "u3"}, count: 3, own: "main"},
			{name: "another taking it over", spec: five, owner: b, claim: Claim{TakeOver: true}, count: 5, own: "copy"},
			{name: "the first is refused now", spec: three, owner: a, want: ErrStoreInUse, count: 5, own: "copy"},
		}},
		{name: "a spec with no owner", preSpec: true, steps: []step{
			{name: "refused", spec: five, owner: a, want: ErrStoreInUse, count: 3},
			{name: "owned when the writer's pods are its members", spec: five, owner: a, claim: Claim{Unowned: true}, count: 5, own: "main"},
		}},
		{name: "refusals that change nothing", steps: []step{
			{name: "an invalid spec", spec: spec.ClusterSpec{MemberCount: 0, EtcdVersion: "3.6.16"}, owner: a, want: ErrRefused},
			{name: "an owner with no name", spec: three, owner: spec.ClusterOwner{Kind: "EtcdCluster"}, want: ErrRefused},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			if tc.preSpec {
				if err := s.WriteSpec(ctx, three); err != nil {
					t.Fatal(err)
				}
			}
			for _, st := range tc.steps {
				err := WriteOwnedSpec(ctx, s, st.spec, st.owner, st.claim)
				if (st.want == nil) != (err == nil) || (st.want != nil && !errors.Is(err, st.want)) {
					t.Fatalf("%s: %v, want %v", st.name, err, st.want)
				}
				cs, err := s.ReadSpec(ctx)
				switch {
				case st.count == 0 && !errors.Is(err, store.ErrNotFound):
					t.Fatalf("%s: a spec %v (%v), want none", st.name, cs, err)
				case st.count != 0 && (err != nil || cs.MemberCount != st.count):
					t.Fatalf("%s: spec %v (%v), want %d members", st.name, cs, err, st.count)
				}
				o, err := s.ReadOwner(ctx)
				switch {
				case st.own == "" && !errors.Is(err, store.ErrNotFound):
					t.Fatalf("%s: owner %v (%v), want none", st.name, o, err)
				case st.own != "" && (err != nil || o.Name != st.own):
					t.Fatalf("%s: owner %v (%v), want %s", st.name, o, err, st.own)
				}
			}
		})
	}
}

// A restore is queued only of a whole backup, with the store's spec.
func TestQueueRestoreChecksTheBackup(t *testing.T) {
	ctx := t.Context()
	s := openStore(t)
	if _, err := QueueRestore(ctx, s, "2026-12-02T00:00:00Z-000001", time.Now()); !errors.Is(err, ErrRefused) {
		t.Errorf("a backup the store lacks: %v, want ErrRefused", err)
	}
	if err := s.Write(ctx, "2026-12-02T00:00:00Z-000002/etcd.backup.gz", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := QueueRestore(ctx, s, "2026-12-02T00:00:00Z-000002", time.Now()); !errors.Is(err, ErrRefused) {
		t.Errorf("a backup without its meta: %v, want ErrRefused", err)
	}
	if cmds, err := s.ListCommands(ctx); err != nil || len(cmds) != 0 {
		t.Errorf("queued %d commands (%v), want none", len(cmds), err)
	}
}
