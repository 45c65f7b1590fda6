package operator

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanSteps(t *testing.T) {
	store := func(n int32, v string) *spec.ClusterSpec {
		return &spec.ClusterSpec{MemberCount: n, EtcdVersion: v, OrdinalMembers: true}
	}
	members := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, podName(i))
		}
		return out
	}
	tests := []struct {
		name      string
		o         Observed
		sts       int32
		writes    *spec.ClusterSpec
		waitsSome bool
	}{
		{name: "create: the set, and the spec once a pod can write it",
			o:   Observed{Desired: 3, Version: "3.6.16"},
			sts: 3},
		{name: "create: an empty store gets the spec",
			o:   Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true},
			sts: 3, writes: store(3, "3.6.16")},
		{name: "a cluster made by a restore writes no spec before the restore is queued",
			o:   Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, RestorePending: "back"},
			sts: 3, waitsSome: true},
		{name: "steady",
			o:   Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Store: store(3, "3.6.16"), Members: members(3)},
			sts: 3},
		{name: "grow: the set first, in the same pass as the spec",
			o:   Observed{Desired: 5, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Store: store(3, "3.6.16"), Members: members(3)},
			sts: 5, writes: store(5, "3.6.16")},
		{name: "grow: what the operator does not own is kept",
			o: Observed{Desired: 5, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Members: members(3),
				Store: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true, AutoCompactionMode: "revision", AutoCompactionRetention: "1000",
					EtcdSettings: spec.Settings{"quota-backend-bytes": "4294967296"}}},
			sts: 5, writes: &spec.ClusterSpec{MemberCount: 5, EtcdVersion: "3.6.16", OrdinalMembers: true, AutoCompactionMode: "revision", AutoCompactionRetention: "1000",
				EtcdSettings: spec.Settings{"quota-backend-bytes": "4294967296"}}},
		{name: "spec.etcd's fields are written when they differ, the rest kept",
			o: Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Members: members(3),
				Store: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true, AutoCompactionMode: "revision", AutoCompactionRetention: "1000"},
				Owned: Owned{Settings: &spec.Settings{"snapshot-count": "5000"}, Defrag: &spec.DefragPolicy{Window: "0 3 * * *"}}},
			sts: 3, writes: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true, AutoCompactionMode: "revision", AutoCompactionRetention: "1000",
				EtcdSettings: spec.Settings{"snapshot-count": "5000"}, Defrag: &spec.DefragPolicy{Window: "0 3 * * *"}}},
		{name: "spec.etcd's fields as the store has them: nothing written",
			o: Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Members: members(3),
				Store: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true, AutoCompactionMode: "periodic", AutoCompactionRetention: "2h",
					EtcdSettings: spec.Settings{"snapshot-count": "5000"}, Defrag: &spec.DefragPolicy{Off: true}},
				Owned: Owned{Settings: &spec.Settings{"snapshot-count": "5000"}, Compaction: &[2]string{"periodic", "2h"}, Defrag: &spec.DefragPolicy{Off: true}}},
			sts: 3},
		{name: "empty settings in spec.etcd clear the store's",
			o: Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Members: members(3),
				Store: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true, EtcdSettings: spec.Settings{"snapshot-count": "5000"}},
				Owned: Owned{Settings: &spec.Settings{}}},
			sts: 3, writes: store(3, "3.6.16")},
		{name: "shrink: the spec first, the set waits",
			o:   Observed{Desired: 3, StatefulSet: 5, Version: "3.6.16", StoreKnown: true, Store: store(5, "3.6.16"), Members: members(5)},
			sts: 5, writes: store(3, "3.6.16"), waitsSome: true},
		{name: "shrink: the set waits while etcd-4 is a member",
			o:   Observed{Desired: 3, StatefulSet: 5, Version: "3.6.16", StoreKnown: true, Store: store(3, "3.6.16"), Members: []string{podName(0), podName(1), podName(2), podName(4)}},
			sts: 5, waitsSome: true},
		{name: "shrink: ordinals compare as numbers (etcd-10 is above etcd-9)",
			o:   Observed{Desired: 10, StatefulSet: 11, Version: "3.6.16", StoreKnown: true, Store: store(10, "3.6.16"), Members: members(11)},
			sts: 11, waitsSome: true},
		{name: "shrink: the set shrinks once the high ordinals are gone",
			o:   Observed{Desired: 3, StatefulSet: 5, Version: "3.6.16", StoreKnown: true, Store: store(3, "3.6.16"), Members: members(3)},
			sts: 3},
		{name: "shrink: members unknown, the set waits",
			o:   Observed{Desired: 3, StatefulSet: 5, Version: "3.6.16", StoreKnown: true, Store: store(3, "3.6.16")},
			sts: 5, waitsSome: true},
		{name: "shrink: store unreadable, the set waits",
			o:   Observed{Desired: 3, StatefulSet: 5, Version: "3.6.16", Members: members(3)},
			sts: 5, waitsSome: true},
		{name: "version change: only the store's spec",
			o:   Observed{Desired: 3, StatefulSet: 3, Version: "3.7.3", StoreKnown: true, Store: store(3, "3.6.16"), Members: members(3)},
			sts: 3, writes: store(3, "3.7.3")},
		{name: "a spec from etcd-manager-ctl without ordinals is taken over",
			o:   Observed{Desired: 3, StatefulSet: 3, Version: "3.6.16", StoreKnown: true, Store: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}, Members: members(3)},
			sts: 3, writes: store(3, "3.6.16")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanSteps(tc.o)
			if got.StatefulSet != tc.sts {
				t.Errorf("StatefulSet = %d, want %d", got.StatefulSet, tc.sts)
			}
			switch {
			case (got.WriteSpec == nil) != (tc.writes == nil):
				t.Errorf("WriteSpec = %v, want %v", got.WriteSpec, tc.writes)
			case got.WriteSpec != nil && !reflect.DeepEqual(*got.WriteSpec, *tc.writes):
				t.Errorf("WriteSpec = %v, want %v", *got.WriteSpec, *tc.writes)
			}
			if (got.Waiting != "") != tc.waitsSome {
				t.Errorf("Waiting = %q, want waiting: %v", got.Waiting, tc.waitsSome)
			}
		})
	}
}

func podName(i int) string { return fmt.Sprintf("etcd-%d", i) }

func TestOwnedFields(t *testing.T) {
	yes, no := true, false
	i64 := func(v int64) *int64 { return &v }
	i32 := func(v int32) *int32 { return &v }
	cluster := func(e *v1alpha1.EtcdSpec) *v1alpha1.EtcdCluster {
		c := &v1alpha1.EtcdCluster{}
		c.Spec.Version, c.Spec.Etcd = "3.6.16", e
		return c
	}
	tests := []struct {
		name    string
		etcd    *v1alpha1.EtcdSpec
		want    Owned
		wantErr string
	}{
		{name: "none: the store's", etcd: nil},
		{name: "everything", etcd: &v1alpha1.EtcdSpec{
			Settings:   map[string]string{"quota-backend-bytes": "4294967296"},
			Compaction: &v1alpha1.CompactionPolicy{Mode: "revision", Retention: "10000"},
			Defrag: &v1alpha1.DefragPolicy{Auto: &yes, MinReclaimableBytes: i64(1 << 20), MinReclaimablePercent: i32(30), QuotaPercent: i32(90),
				Window: "0 3 * * *", WindowDuration: &metav1.Duration{Duration: 2 * time.Hour}},
		}, want: Owned{
			Settings:   &spec.Settings{"quota-backend-bytes": "4294967296"},
			Compaction: &[2]string{"revision", "10000"},
			Defrag: &spec.DefragPolicy{MinReclaimableBytes: 1 << 20, MinReclaimableFraction: 0.3, QuotaPercent: 90,
				Window: "0 3 * * *", WindowDuration: "2h0m0s"},
		}},
		{name: "defragmentation off", etcd: &v1alpha1.EtcdSpec{Defrag: &v1alpha1.DefragPolicy{Auto: &no}},
			want: Owned{Defrag: &spec.DefragPolicy{Off: true}}},
		{name: "a flag outside the allow-list", etcd: &v1alpha1.EtcdSpec{Settings: map[string]string{"data-dir": "/tmp"}}, wantErr: "data-dir"},
		{name: "a flag this version lacks", etcd: &v1alpha1.EtcdSpec{Settings: map[string]string{"warning-apply-duration": "200ms"}},
			wantErr: "warning-apply-duration"},
		{name: "a bad retention", etcd: &v1alpha1.EtcdSpec{Compaction: &v1alpha1.CompactionPolicy{Mode: "revision", Retention: "lots"}}, wantErr: "revision retention"},
		{name: "a bad window", etcd: &v1alpha1.EtcdSpec{Defrag: &v1alpha1.DefragPolicy{Window: "every night"}}, wantErr: "--defrag-window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cluster(tt.etcd)
			if tt.name == "a flag this version lacks" {
				c.Spec.Version = "3.5.35"
			}
			got, err := OwnedFields(c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("OwnedFields: %v, want an error about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("OwnedFields = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPlanStoreUse(t *testing.T) {
	self := spec.ClusterOwner{Kind: spec.OwnerKindEtcdCluster, Namespace: "db", Name: "main", UID: "u1"}
	other := &spec.ClusterOwner{Kind: spec.OwnerKindEtcdCluster, Namespace: "db", Name: "old", UID: "u0"}
	again := &spec.ClusterOwner{Kind: spec.OwnerKindEtcdCluster, Namespace: "db", Name: "main", UID: "u9"}
	for _, tc := range []struct {
		name              string
		u                 StoreUse
		inUse             string // in the reason; "" for none
		takeOver, unowned bool
	}{
		{name: "a fresh store", u: StoreUse{}},
		{name: "its own", u: StoreUse{Owner: &self, HasSpec: true}},
		{name: "its own, the object made again", u: StoreUse{Owner: again, HasSpec: true}},
		{name: "a live cluster's", u: StoreUse{Owner: other, OwnerExists: true, HasSpec: true}, inUse: "the spec of EtcdCluster db/old, which exists"},
		{name: "a live cluster's, even asked to take it", u: StoreUse{Owner: other, OwnerExists: true, HasSpec: true, TakeOver: true}, inUse: "which exists"},
		{name: "a gone cluster's", u: StoreUse{Owner: other, HasSpec: true}, inUse: "annotate this EtcdCluster etcd-manager.dev/take-over-store=true"},
		{name: "a gone cluster's, taken over (a restore's)", u: StoreUse{Owner: other, HasSpec: true, TakeOver: true}, takeOver: true},
		{name: "an unowned spec", u: StoreUse{HasSpec: true}, inUse: "no owner record"},
		{name: "an unowned spec its pods are members of (an older operator's)", u: StoreUse{HasSpec: true, OwnMembers: true}, unowned: true},
		{name: "an unowned spec, taken over", u: StoreUse{HasSpec: true, TakeOver: true}, unowned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inUse, takeOver, unowned := PlanStoreUse(self, tc.u)
			if (tc.inUse == "") != (inUse == "") || !strings.Contains(inUse, tc.inUse) || takeOver != tc.takeOver || unowned != tc.unowned {
				t.Errorf("PlanStoreUse = %q, %v, %v; want %q, %v, %v", inUse, takeOver, unowned, tc.inUse, tc.takeOver, tc.unowned)
			}
		})
	}
}

func TestImageLacks(t *testing.T) {
	r := &ClusterReconciler{Image: "etcd-manager:v2", ImageVersions: []string{"3.5.35", "3.6.16"}}
	member := func(v string) cli.AgentStatus {
		return cli.AgentStatus{ID: "main-0", Role: cli.RoleMember, EtcdVersion: v}
	}
	for _, tc := range []struct {
		name   string
		c      *v1alpha1.EtcdCluster
		status *cli.ClusterStatus
		lacks  string
	}{
		{name: "carried", c: cluster(nil), status: &cli.ClusterStatus{Agents: []cli.AgentStatus{member("3.6.16")}}},
		{name: "the wanted version missing", c: cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.Version = "3.6.15" }), lacks: "not 3.6.15"},
		{name: "the version the members run missing", c: cluster(nil), status: &cli.ClusterStatus{Agents: []cli.AgentStatus{member("3.5.34")}}, lacks: "not 3.5.34"},
		{name: "an image of the user's own is theirs to check", c: cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.Image = "mine"; c.Spec.Version = "3.6.15" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := r.imageLacks(tc.c, tc.status)
			if (tc.lacks == "") != (got == "") || !strings.Contains(got, tc.lacks) {
				t.Errorf("imageLacks = %q, want %q", got, tc.lacks)
			}
		})
	}
	if got := (&ClusterReconciler{Image: "x"}).imageLacks(cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.Version = "3.6.15" }), nil); got != "" {
		t.Errorf("with the image's versions unknown: %q, want no hold", got)
	}
}

func TestReadImageVersions(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("3.5.35,3.6.16,3.7.3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadImageVersions(good); err != nil || !slices.Equal(got, []string{"3.5.35", "3.6.16", "3.7.3"}) {
		t.Errorf("ReadImageVersions = %v, %v", got, err)
	}
	if got, err := ReadImageVersions(filepath.Join(dir, "none")); err != nil || got != nil {
		t.Errorf("no file: %v, %v; want nothing known", got, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("3.6,rm -rf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImageVersions(bad); err == nil {
		t.Error("a file of junk was read")
	}
}
