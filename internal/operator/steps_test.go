package operator

import (
	"fmt"
	"reflect"
	"testing"

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
