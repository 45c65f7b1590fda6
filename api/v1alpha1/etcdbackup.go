package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EtcdBackup asks for one backup of a cluster, now: it queues a backup-now
// command in the cluster's store and follows it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=etcd-manager
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Backup",type=string,JSONPath=`.status.backupName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdBackupSpec   `json:"spec"`
	Status EtcdBackupStatus `json:"status,omitempty"`
}

// EtcdBackupList is a list of EtcdBackup.
//
// +kubebuilder:object:root=true
type EtcdBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdBackup `json:"items"`
}

// EtcdBackupSpec names the cluster to back up.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="an EtcdBackup's spec cannot change; create another"
type EtcdBackupSpec struct {
	// ClusterName is the EtcdCluster, in the same namespace.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ClusterName string `json:"clusterName"`
}

// BackupPhase is where an EtcdBackup stands.
//
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type BackupPhase string

// Phases of an EtcdBackup.
const (
	BackupPending   BackupPhase = "Pending"
	BackupRunning   BackupPhase = "Running"
	BackupSucceeded BackupPhase = "Succeeded"
	BackupFailed    BackupPhase = "Failed"
)

// EtcdBackupStatus follows the backup.
type EtcdBackupStatus struct {
	// +optional
	Phase BackupPhase `json:"phase,omitempty"`
	// CommandID is the backup-now command queued in the store.
	// +optional
	CommandID string `json:"commandID,omitempty"`
	// BackupName is the backup's name in the store.
	// +optional
	BackupName string `json:"backupName,omitempty"`
	// Size is the snapshot's size in bytes.
	// +optional
	Size int64 `json:"size,omitempty"`
	// Revision is etcd's revision in the snapshot.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// CompletionTime is when the backup was written.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Message says why a backup is waiting or failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// EtcdBackupSchedule creates EtcdBackup objects on a cron schedule and keeps
// the newest of them. Backups in the store follow the cluster's own
// retention, not these limits.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=etcd-manager
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Schedule",type=string,JSONPath=`.spec.schedule`
// +kubebuilder:printcolumn:name="Last",type=date,JSONPath=`.status.lastScheduleTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdBackupSchedule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdBackupScheduleSpec   `json:"spec"`
	Status EtcdBackupScheduleStatus `json:"status,omitempty"`
}

// EtcdBackupScheduleList is a list of EtcdBackupSchedule.
//
// +kubebuilder:object:root=true
type EtcdBackupScheduleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdBackupSchedule `json:"items"`
}

// EtcdBackupScheduleSpec is a schedule and what it creates.
type EtcdBackupScheduleSpec struct {
	// Schedule in cron format, such as "0 * * * *" (minute hour day month
	// weekday), or a descriptor such as @hourly.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Schedule string `json:"schedule"`

	// BackupTemplate is the spec of each EtcdBackup created.
	BackupTemplate EtcdBackupSpec `json:"backupTemplate"`

	// Suspend stops new backups; those running go on.
	//
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// SuccessfulBackupsHistoryLimit is how many succeeded EtcdBackup
	// objects are kept (default 3).
	//
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +optional
	SuccessfulBackupsHistoryLimit *int32 `json:"successfulBackupsHistoryLimit,omitempty"`

	// FailedBackupsHistoryLimit is how many failed EtcdBackup objects are
	// kept (default 1).
	//
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	FailedBackupsHistoryLimit *int32 `json:"failedBackupsHistoryLimit,omitempty"`
}

// EtcdBackupScheduleStatus follows the schedule.
type EtcdBackupScheduleStatus struct {
	// +optional
	LastScheduleTime *metav1.Time `json:"lastScheduleTime,omitempty"`
	// +optional
	LastSuccessfulTime *metav1.Time `json:"lastSuccessfulTime,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
