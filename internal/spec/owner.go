package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ClusterOwner is our addition, kept at control/etcd-cluster-owner: the
// Kubernetes object whose operator writes the store's spec. One store
// holds one cluster: an EtcdCluster refuses a store whose owner is
// another, so that two of them, one copied from the other, never write the
// same spec in turn. kops reads only the spec, the creation marker and the
// commands' files under control/, so it never sees this object.
type ClusterOwner struct {
	// Kind is the owner's kind: EtcdCluster.
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID is the object's UID when the record was written; a cluster
	// deleted and made again under its name gets another, and still owns
	// the store.
	UID string `json:"uid,omitempty"`
}

// OwnerKindEtcdCluster is the owner kind of the Kubernetes operator.
const OwnerKindEtcdCluster = "EtcdCluster"

// MaxOwnerField bounds each field of an owner record: Kubernetes names
// are at most 253 bytes.
const MaxOwnerField = 253

// String names the owner as kubectl does: kind/namespace/name.
func (o ClusterOwner) String() string { return o.Kind + " " + o.Namespace + "/" + o.Name }

// Same says whether o and p name the same object, whatever its UID.
func (o ClusterOwner) Same(p ClusterOwner) bool {
	return o.Kind == p.Kind && o.Namespace == p.Namespace && o.Name == p.Name
}

// Validate checks an owner record: a kind, a name, and no field too long
// or with characters a name cannot have.
func (o ClusterOwner) Validate() error {
	if o.Kind == "" || o.Name == "" {
		return errors.New("spec: the owner record names no kind or no name")
	}
	for _, f := range []string{o.Kind, o.Namespace, o.Name, o.UID} {
		if len(f) > MaxOwnerField || strings.ContainsFunc(f, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return fmt.Errorf("spec: the owner record's field %s is not a name", QuoteShort(f))
		}
	}
	return nil
}

// DecodeClusterOwner parses and checks the JSON of
// control/etcd-cluster-owner.
func DecodeClusterOwner(data []byte) (ClusterOwner, error) {
	var o ClusterOwner
	if len(bytes.TrimSpace(data)) == 0 {
		return o, errors.New("spec: the owner record is empty")
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("spec: the owner record is not valid JSON: %w", err)
	}
	return o, o.Validate()
}
