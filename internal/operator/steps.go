package operator

import (
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Observed is what the cluster reconcile saw of one EtcdCluster.
type Observed struct {
	// Desired is spec.replicas.
	Desired int32
	// StatefulSet is the StatefulSet's replicas; 0 before it exists.
	StatefulSet int32
	// Store is the cluster spec in the store; nil when none is known,
	// either because none was written or because no pod could read it.
	Store *spec.ClusterSpec
	// StoreKnown says the store was read (Store nil then means empty).
	StoreKnown bool
	// Members are etcd's member names, as the agents report them; nil
	// when unknown.
	Members []string
	// Version is spec.version.
	Version string
	// RestorePending is the EtcdRestore that made this cluster from a
	// template and has yet to queue its restore: until it has, the store
	// gets no spec, so that the agents cannot create an empty cluster
	// that clients might write to before the restore replaces it.
	RestorePending string
	// Owned are the store spec's fields spec.etcd sets.
	Owned Owned
}

// Owned are the store spec's fields an EtcdCluster sets; each nil one
// keeps what the store holds (configure-cluster's, or the defaults).
type Owned struct {
	Settings *spec.Settings
	// Compaction is the mode and the retention.
	Compaction *[2]string
	Defrag     *spec.DefragPolicy
}

// apply sets the owned fields of s.
func (w Owned) apply(s *spec.ClusterSpec) {
	if w.Settings != nil {
		s.EtcdSettings = w.Settings.Clone()
		if len(s.EtcdSettings) == 0 {
			s.EtcdSettings = nil
		}
	}
	if w.Compaction != nil {
		s.AutoCompactionMode, s.AutoCompactionRetention = w.Compaction[0], w.Compaction[1]
	}
	if w.Defrag != nil {
		d := *w.Defrag
		s.Defrag = &d
	}
}

// sameSpec says whether the store's spec is the one wanted.
func sameSpec(a, b spec.ClusterSpec) bool {
	return a.MemberCount == b.MemberCount && a.EtcdVersion == b.EtcdVersion && a.OrdinalMembers == b.OrdinalMembers &&
		a.EtcdSettings.Equal(b.EtcdSettings) &&
		a.AutoCompactionMode == b.AutoCompactionMode && a.AutoCompactionRetention == b.AutoCompactionRetention &&
		(a.Defrag == nil) == (b.Defrag == nil) && (a.Defrag == nil || *a.Defrag == *b.Defrag)
}

// Steps is what the reconcile does next. The order matters, and is the
// point: growing, the StatefulSet first, so that new pods are standbys
// when the store asks for them; shrinking, the store first, so that the
// engine removes the highest ordinals, and the StatefulSet only once their
// members are gone.
type Steps struct {
	// StatefulSet is the replicas to set.
	StatefulSet int32
	// WriteSpec is the spec to write to the store, nil for none.
	WriteSpec *spec.ClusterSpec
	// Waiting says what a shrink waits for, empty when nothing.
	Waiting string
}

// PlanSteps decides the next steps from what was observed; it is pure.
func PlanSteps(o Observed) Steps {
	st := Steps{StatefulSet: max(o.StatefulSet, o.Desired)}
	want := spec.ClusterSpec{MemberCount: o.Desired, EtcdVersion: o.Version, OrdinalMembers: true}
	if o.RestorePending != "" {
		st.Waiting = "EtcdRestore " + o.RestorePending + " to queue its restore (annotation " + AnnotationRestorePending + ")"
		return st
	}
	if o.StoreKnown {
		if o.Store != nil {
			// Keep what the operator does not own: the etcd fields the
			// EtcdCluster leaves out, and a dump-and-restore allowance
			// for the version it was given for.
			kept := *o.Store
			kept.MemberCount, kept.EtcdVersion, kept.OrdinalMembers = want.MemberCount, want.EtcdVersion, true
			kept.AllowDumpRestore = o.Store.AllowDumpRestore && o.Store.EtcdVersion == want.EtcdVersion
			want = kept
		}
		o.Owned.apply(&want)
		if o.Store == nil || !sameSpec(*o.Store, want) {
			st.WriteSpec = &want
		}
	}
	if o.StatefulSet <= o.Desired {
		return st
	}
	// Shrinking: only once the store asks for the smaller count, and every
	// member above it is gone.
	switch {
	case !o.StoreKnown || o.Store == nil || o.Store.MemberCount != o.Desired:
		st.Waiting = "the store to ask for fewer members"
	case o.Members == nil:
		st.Waiting = "the members to be known"
	default:
		highest := int32(-1)
		for _, m := range o.Members {
			if n, ok := spec.Ordinal(m); ok {
				highest = max(highest, int32(n))
			}
		}
		if highest >= o.Desired || int32(len(o.Members)) > o.Desired {
			st.Waiting = "the engine to remove the members of the highest ordinals"
			return st
		}
		st.StatefulSet = o.Desired
	}
	return st
}

// StoreUse is what the reconcile knows of who else holds a cluster's
// store, once an agent has read it.
type StoreUse struct {
	// Owner is the store's owner record, nil when it has none.
	Owner *spec.ClusterOwner
	// OwnerExists says the owner's object is in this Kubernetes cluster
	// (or may be: the operator may not see it).
	OwnerExists bool
	// HasSpec says the store holds a spec, valid or not.
	HasSpec bool
	// OwnMembers says an agent reports that one of this cluster's pods is
	// an etcd member: the store is this cluster's own.
	OwnMembers bool
	// TakeOver says the user lets this cluster take the store: it was
	// made by an EtcdRestore, or carries AnnotationTakeOverStore.
	TakeOver bool
}

// PlanStoreUse decides whether self may write the store's spec: inUse,
// when not empty, says why it may not; takeOver and unowned are the claim
// its write makes (see operatorapi.WriteSpecRequest). One store holds one
// cluster: a store another EtcdCluster owns is never taken from a live
// one, and one owned by an object that is gone, or holding a spec no one
// owns, only by a cluster whose pods are its members, or on purpose. It
// is pure.
func PlanStoreUse(self spec.ClusterOwner, u StoreUse) (inUse string, takeOver, unowned bool) {
	switch o := u.Owner; {
	case o != nil && o.Same(self):
		return "", false, false
	case o != nil && u.OwnerExists:
		return fmt.Sprintf("the backup store holds the spec of %s, which exists: one store holds one cluster; give this cluster a store of its own", o), false, false
	case o != nil && !u.TakeOver:
		return fmt.Sprintf("the backup store holds the spec of %s, which this Kubernetes cluster does not hold (deleted, or run elsewhere): to take its store over, annotate this EtcdCluster %s=true", o, AnnotationTakeOverStore), false, false
	case o != nil:
		return "", true, false
	case u.HasSpec && !u.OwnMembers && !u.TakeOver:
		return fmt.Sprintf("the backup store holds a cluster spec with no owner record (written by etcd-manager-ctl, or by another operator) and none of this cluster's pods is its member: to take it over, annotate this EtcdCluster %s=true", AnnotationTakeOverStore), false, false
	case u.HasSpec:
		return "", false, true
	}
	return "", false, false
}
