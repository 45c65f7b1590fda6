package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EtcdCluster is an etcd cluster run by etcd-manager agents in the pods of a
// StatefulSet, with its spec kept in a backup store.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=etcd,categories=etcd-manager
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$')",message="the name must be 1 to 52 lowercase letters, digits and dashes, starting with a letter: it names the StatefulSet, its Services, its pods and the agents' cluster"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.readyMembers`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.currentVersion`
// +kubebuilder:printcolumn:name="Last backup",type=date,JSONPath=`.status.lastBackup.time`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdClusterSpec   `json:"spec"`
	Status EtcdClusterStatus `json:"status,omitempty"`
}

// EtcdClusterList is a list of EtcdCluster.
//
// +kubebuilder:object:root=true
type EtcdClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdCluster `json:"items"`
}

// DeletionPolicy says what deleting an EtcdCluster removes.
//
// +kubebuilder:validation:Enum=Retain;Delete
type DeletionPolicy string

// Deletion policies. The backup store is never deleted by the operator.
const (
	// DeletionRetain keeps the PersistentVolumeClaims.
	DeletionRetain DeletionPolicy = "Retain"
	// DeletionDelete removes the PersistentVolumeClaims with the cluster.
	DeletionDelete DeletionPolicy = "Delete"
)

// EtcdClusterSpec is the desired state of an etcd cluster.
//
// +kubebuilder:validation:XValidation:rule="self.backupStore.url == oldSelf.backupStore.url",message="backupStore.url cannot change: a different store is a different cluster"
// +kubebuilder:validation:XValidation:rule="(has(self.tls) && has(self.tls.enabled) ? self.tls.enabled : true) == (has(oldSelf.tls) && has(oldSelf.tls.enabled) ? oldSelf.tls.enabled : true)",message="tls.enabled cannot change on a running cluster"
// +kubebuilder:validation:XValidation:rule="has(self.storage) == has(oldSelf.storage) && (!has(self.storage) || self.storage == oldSelf.storage)",message="storage cannot change: a StatefulSet's volume claim template is fixed"
// +kubebuilder:validation:XValidation:rule="has(self.tls) && has(self.tls.caSecret) ? (has(oldSelf.tls) && has(oldSelf.tls.caSecret) && self.tls.caSecret == oldSelf.tls.caSecret) : !(has(oldSelf.tls) && has(oldSelf.tls.caSecret))",message="tls.caSecret cannot change on a running cluster: its members trust one CA"
type EtcdClusterSpec struct {
	// Replicas is the number of etcd members. An odd number is
	// recommended: 3 tolerates one failure, 5 two.
	//
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Version is the etcd version, such as 3.6.16. Changing it rolls etcd
	// inside the running pods, one member at a time, leader last.
	//
	// +kubebuilder:validation:Pattern=`^3\.[4-9]\.[0-9]+$`
	Version string `json:"version"`

	// Image is the etcd-manager image of the member pods. Empty means the
	// operator's own image. Changing it restarts the pods one at a time,
	// health-gated, leader last.
	//
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// BackupStore is where the cluster's spec, commands and backups live:
	// the source of truth whenever etcd is down.
	BackupStore BackupStore `json:"backupStore"`

	// ClientPort is the port etcd serves clients on, in the pods and on
	// the Services. Left out: 2379 for a new cluster; a cluster made by
	// an operator from before the field keeps the 4001 it serves on.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="self != 2380 && self != 8000 && self != 8001 && self != 8080",message="clientPort must differ from the pods' other ports: 2380 (peers), 8000 (agents), 8001 (quarantine) and 8080 (metrics)"
	// +optional
	ClientPort *int32 `json:"clientPort,omitempty"`

	// Storage is the volume claim template of each member's data.
	// Without it, members keep their data in an emptyDir, which a pod's
	// deletion loses.
	//
	// +optional
	Storage *corev1.PersistentVolumeClaimSpec `json:"storage,omitempty"`

	// TLS of etcd's client and peer traffic and of the agents' peer API.
	//
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`

	// PodTemplate adds to the member pods.
	//
	// +optional
	PodTemplate *PodTemplate `json:"podTemplate,omitempty"`

	// Backup says how often backups are taken and how long they are kept.
	//
	// +optional
	Backup *BackupPolicy `json:"backup,omitempty"`

	// MemberFailureGrace is how long a member may be unhealthy before it
	// is replaced (default 1m).
	//
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="memberFailureGrace must not be negative"
	// +optional
	MemberFailureGrace *metav1.Duration `json:"memberFailureGrace,omitempty"`

	// Etcd are etcd's own settings and the maintenance policies of the
	// engine. A field left out keeps what the store holds (set by
	// etcd-manager-ctl configure-cluster, or the defaults); a field set
	// here is the operator's, and written to the store when it differs.
	//
	// +optional
	Etcd *EtcdSpec `json:"etcd,omitempty"`

	// DeletionPolicy says whether deleting the cluster removes its
	// PersistentVolumeClaims (Delete) or keeps them (Retain, the default).
	// The backup store is never deleted.
	//
	// +kubebuilder:default=Retain
	// +optional
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`
}

// EtcdSpec holds etcd's settings, compaction and defragmentation.
type EtcdSpec struct {
	// Settings are etcd flags set on every member, by etcd's own names
	// without the dashes, from etcd-manager's allow-list:
	// quota-backend-bytes, snapshot-count, heartbeat-interval,
	// election-timeout, max-request-bytes, max-concurrent-streams,
	// max-txn-ops, the grpc-keepalive ones, and a few more (see
	// docs/maintenance.md). A flag the spec's etcd version does not know is
	// refused before the store is touched. A change rolls etcd one member
	// at a time, leader last. Present, the map is the whole set: a flag
	// removed goes back to etcd's default.
	//
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z][a-z0-9-]{0,62}$') && self[k].size() <= 256)",message="settings are etcd flag names without the dashes, such as quota-backend-bytes, with values of at most 256 bytes"
	// +optional
	Settings map[string]string `json:"settings,omitempty"`

	// Compaction is how much history etcd keeps; the agent compacts,
	// keeping behind continuous capture. Default: periodic, 1h.
	//
	// +optional
	Compaction *CompactionPolicy `json:"compaction,omitempty"`

	// Defrag says when the engine defragments members on its own, one at
	// a time, followers first, never the leader in place.
	//
	// +optional
	Defrag *DefragPolicy `json:"defrag,omitempty"`
}

// CompactionPolicy is a compaction policy in the terms of etcd's
// --auto-compaction-mode and --auto-compaction-retention.
type CompactionPolicy struct {
	// Mode is periodic (keep a span of time) or revision (keep a count of
	// revisions).
	//
	// +kubebuilder:validation:Enum=periodic;revision
	Mode string `json:"mode"`

	// Retention is, for periodic, a duration such as 30m or a number of
	// hours; for revision, a number of revisions. "0" turns compaction
	// off.
	//
	// +kubebuilder:validation:MaxLength=32
	Retention string `json:"retention"`
}

// DefragPolicy says when members are defragmented. A member is due when
// at least minReclaimableBytes of its database are free, and either at
// least minReclaimablePercent of it is, or the database is at
// quotaPercent of the backend quota or more.
type DefragPolicy struct {
	// Auto turns defragmentation by policy on (the default) or off.
	//
	// +optional
	Auto *bool `json:"auto,omitempty"`

	// MinReclaimableBytes (default 64Mi).
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReclaimableBytes *int64 `json:"minReclaimableBytes,omitempty"`

	// MinReclaimablePercent (default 50).
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MinReclaimablePercent *int32 `json:"minReclaimablePercent,omitempty"`

	// QuotaPercent (default 80).
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	QuotaPercent *int32 `json:"quotaPercent,omitempty"`

	// Window limits defragmentation to windowDuration after each time
	// this cron schedule (in UTC, five fields) names, such as "0 3 * * *".
	//
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:XValidation:rule="!self.upperAscii().startsWith('TZ=') && !self.upperAscii().startsWith('CRON_TZ=')",message="the defrag window is in UTC; it takes no time zone"
	// +optional
	Window string `json:"window,omitempty"`

	// WindowDuration is how long each window stays open (default 1h).
	//
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="defrag.windowDuration must be from 1m to 168h"
	// +optional
	WindowDuration *metav1.Duration `json:"windowDuration,omitempty"`
}

// BackupStore names the backup store and how to reach it.
//
// +kubebuilder:validation:XValidation:rule="self.url.startsWith('file://') == has(self.volume)",message="a file:// store needs a volume that every member pod mounts at its path, and only a file:// store takes one"
type BackupStore struct {
	// URL of the store: file:///path, s3://bucket/prefix,
	// gs://bucket/prefix or azblob://container/prefix.
	//
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches('^(file:///|s3://|gs://|azblob://).+')",message="url must start with file:///, s3://, gs:// or azblob://"
	URL string `json:"url"`

	// CredentialsSecret names a Secret in the cluster's namespace whose
	// keys become environment variables of the agents, such as
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
	//
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// Volume is mounted at a file:// store's path in every member pod:
	// NFS, hostPath on a single node, or any shared volume.
	//
	// +optional
	Volume *corev1.VolumeSource `json:"volume,omitempty"`
}

// TLSSpec configures TLS.
type TLSSpec struct {
	// Enabled turns TLS on (the default) for etcd and the agents' peer
	// API. It cannot change on a running cluster.
	//
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// CASecret names a Secret holding the cluster's CA as tls.crt and
	// tls.key. Without it the operator generates a CA into the Secret
	// <name>-ca. On Kubernetes the CA is never written to the store.
	//
	// +optional
	CASecret string `json:"caSecret,omitempty"`
}

// PodTemplate is what may be added to the member pods.
type PodTemplate struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// SecurityContext is merged over the member pods' own, which passes
	// the restricted Pod Security Standard (user and group 65532, fsGroup
	// 65532, seccomp RuntimeDefault): each field set here replaces the
	// default's, so a pod is weaker only where you say so.
	//
	// +optional
	SecurityContext *corev1.PodSecurityContext `json:"securityContext,omitempty"`

	// ContainerSecurityContext is merged over the agent container's own
	// (no privilege escalation, every capability dropped, a read-only
	// root file system, non-root), as securityContext is.
	//
	// +optional
	ContainerSecurityContext *corev1.SecurityContext `json:"containerSecurityContext,omitempty"`

	// ImagePullSecrets name Secrets to pull the image with.
	//
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// ServiceAccountName is the pods' service account. The agents call no
	// Kubernetes API: its token is not mounted.
	//
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// TopologySpreadConstraints of the member pods. Left out, the pods
	// spread across nodes (kubernetes.io/hostname) where they can.
	//
	// +optional
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
}

// BackupPolicy says when backups are taken and which are kept.
type BackupPolicy struct {
	// Interval between periodic full backups (default 15m, at least 1m).
	//
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="backup.interval must be at least 1m"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// Retention says which backups the engine keeps in the store: default
	// (everything under 1h, hourly for 7d, daily for 90d), exponential, or
	// count:N.
	//
	// +kubebuilder:validation:Pattern=`^(default|exponential|count:[1-9][0-9]*)$`
	// +optional
	Retention string `json:"retention,omitempty"`

	// Encryption encrypts backups and captured segments at rest, on the
	// agents, with an age key kept in a Secret (see docs/security.md).
	// Without it they are stored in the clear.
	//
	// +optional
	Encryption *BackupEncryption `json:"encryption,omitempty"`
}

// BackupEncryption names the Secrets holding the age keys (one identity
// each, as age-keygen writes it) that the agents encrypt with and
// decrypt with. Each Secret is mounted read-only, mode 0400.
type BackupEncryption struct {
	// KeySecret is the Secret, in the cluster's namespace, whose Key holds
	// the key new backups and segments are encrypted with.
	//
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`
	KeySecret string `json:"keySecret"`

	// Key is the key of each Secret that holds the age identity; default
	// "key".
	//
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]{1,253}$`
	// +optional
	Key string `json:"key,omitempty"`

	// DecryptionKeySecrets are Secrets holding older keys, under the same
	// Key, only to read what they encrypted: during a key rotation.
	//
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`
	// +optional
	DecryptionKeySecrets []string `json:"decryptionKeySecrets,omitempty"`
}

// EtcdClusterStatus is the observed state of an etcd cluster.
type EtcdClusterStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas is the number of etcd members (for the scale subresource).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// ReadyReplicas is the number of healthy started members.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// ReadyMembers is ReadyReplicas/Replicas, for printing.
	// +optional
	ReadyMembers string `json:"readyMembers,omitempty"`
	// Selector selects the member pods (for the scale subresource).
	// +optional
	Selector string `json:"selector,omitempty"`
	// CurrentVersion is the etcd version every member runs, when they
	// agree.
	// +optional
	CurrentVersion string `json:"currentVersion,omitempty"`
	// Leader is the name of the member that leads raft.
	// +optional
	Leader string `json:"leader,omitempty"`
	// Members are etcd's members as the cluster reports them.
	// +optional
	// +listType=map
	// +listMapKey=name
	Members []MemberStatus `json:"members,omitempty"`
	// LastBackup is the newest backup in the store.
	// +optional
	LastBackup *BackupRef `json:"lastBackup,omitempty"`
	// Conditions: Available, Progressing, Degraded and BackupReady.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MemberStatus is one etcd member.
type MemberStatus struct {
	// Name is the member's name: its pod's name.
	Name string `json:"name"`
	// ID is etcd's member ID, in hex.
	// +optional
	ID string `json:"id,omitempty"`
	// Role is leader, follower or learner.
	// +optional
	Role string `json:"role,omitempty"`
	// Version is the etcd version the member runs.
	// +optional
	Version string `json:"version,omitempty"`
	// Healthy says the member answered a status call.
	Healthy bool `json:"healthy"`
	// Learner says the member is a learner, not yet a voter.
	// +optional
	Learner bool `json:"learner,omitempty"`
}

// BackupRef names a backup in the store.
type BackupRef struct {
	Name string      `json:"name"`
	Time metav1.Time `json:"time"`
}

// Condition types of an EtcdCluster.
const (
	// ConditionAvailable: every wanted member is started and healthy.
	ConditionAvailable = "Available"
	// ConditionProgressing: the cluster is being created, scaled, rolled
	// or restored.
	ConditionProgressing = "Progressing"
	// ConditionDegraded: a member is unhealthy or missing, or the
	// operator cannot do its part.
	ConditionDegraded = "Degraded"
	// ConditionBackupReady: a backup newer than twice the interval exists.
	ConditionBackupReady = "BackupReady"
)
