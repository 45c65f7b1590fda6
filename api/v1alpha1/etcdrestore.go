package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EtcdRestore restores a backup: into an existing cluster, in place, through
// the engine's quarantined, verified restore; or into a new EtcdCluster made
// from a template.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=etcd-manager
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.status.clusterName`
// +kubebuilder:printcolumn:name="Backup",type=string,JSONPath=`.spec.backupName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdRestore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdRestoreSpec   `json:"spec"`
	Status EtcdRestoreStatus `json:"status,omitempty"`
}

// EtcdRestoreList is a list of EtcdRestore.
//
// +kubebuilder:object:root=true
type EtcdRestoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdRestore `json:"items"`
}

// EtcdRestoreSpec names the backup and where it goes.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="an EtcdRestore's spec cannot change; create another"
// +kubebuilder:validation:XValidation:rule="has(self.clusterName) != has(self.clusterTemplate)",message="set exactly one of clusterName (restore in place) and clusterTemplate (a new cluster)"
type EtcdRestoreSpec struct {
	// ClusterName is an existing EtcdCluster, in the same namespace, to
	// restore in place.
	//
	// +kubebuilder:validation:MaxLength=63
	// +optional
	ClusterName string `json:"clusterName,omitempty"`

	// ClusterTemplate creates a new EtcdCluster from the backup, found in
	// the template's backup store.
	//
	// +optional
	ClusterTemplate *ClusterTemplate `json:"clusterTemplate,omitempty"`

	// BackupName is the backup to restore, as list-backups names it.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	BackupName string `json:"backupName"`
}

// ClusterTemplate is the new cluster a restore creates.
type ClusterTemplate struct {
	// Name of the new EtcdCluster.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=52
	Name string `json:"name"`
	// Spec of the new EtcdCluster.
	Spec EtcdClusterSpec `json:"spec"`
}

// RestorePhase is where an EtcdRestore stands.
//
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type RestorePhase string

// Phases of an EtcdRestore.
const (
	RestorePending   RestorePhase = "Pending"
	RestoreRunning   RestorePhase = "Running"
	RestoreSucceeded RestorePhase = "Succeeded"
	RestoreFailed    RestorePhase = "Failed"
)

// EtcdRestoreStatus follows the restore.
type EtcdRestoreStatus struct {
	// +optional
	Phase RestorePhase `json:"phase,omitempty"`
	// Step is the engine's restore phase, such as quarantine or verify.
	// +optional
	Step string `json:"step,omitempty"`
	// ClusterName is the EtcdCluster restored into: spec.clusterName, or
	// the one made from spec.clusterTemplate.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`
	// CommandID is the restore command queued in the store.
	// +optional
	CommandID string `json:"commandID,omitempty"`
	// ReplacedClusterID is the etcd cluster ID the members reported when
	// the restore was queued, empty if none did. The restored cluster has
	// a new one, which tells a finished restore from a command deleted by
	// hand.
	// +optional
	ReplacedClusterID string `json:"replacedClusterID,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// CommandEndTime is when the restore's command was first seen gone
	// from the queue; the restored members must report soon after.
	// +optional
	CommandEndTime *metav1.Time `json:"commandEndTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}
