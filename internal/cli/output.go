package cli

import (
	"time"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The JSON the ctl prints with --output=json. The Kubernetes operator reads
// it too, so a field's name and meaning never change; new ones may be added.

// AgentStatus is one agent in `status`.
type AgentStatus struct {
	ID          string `json:"id"`
	Address     string `json:"address"`
	Role        string `json:"role"`
	EtcdVersion string `json:"etcdVersion,omitempty"`
	// AgentVersion is the agent's build.
	AgentVersion string `json:"agentVersion,omitempty"`
	Healthy      bool   `json:"healthy"`
	DBSize       int64  `json:"dbSize,omitempty"`
	ClientURL    string `json:"clientURL,omitempty"`
	MemberID     string `json:"memberId,omitempty"`
	ClusterID    string `json:"clusterId,omitempty"`
	// ClockOffset is the largest offset the agent measured between its
	// clock and a peer's.
	ClockOffset time.Duration `json:"clockOffsetNanos"`
	// LockRefused says why the agent will not take the store lock.
	LockRefused string `json:"lockRefused,omitempty"`
	// Procedure is the procedure the agent drives, and its phase.
	Procedure string `json:"procedure,omitempty"`
	// EtcdLeader is true when the agent's etcd member is the raft leader,
	// as that member itself reports. Role "leader" is the manager leader,
	// which need not be the same node.
	EtcdLeader bool `json:"etcdLeader,omitempty"`
	// EtcdSettings are the spec's etcd settings its etcd runs with.
	EtcdSettings spec.Settings `json:"etcdSettings,omitempty"`
	// Cert is the node certificate the agent uses and its CA, when it
	// runs TLS.
	Cert *peer.CertInfo `json:"cert,omitempty"`
	// BackupKeys are the IDs of the encryption keys the agent holds for
	// backups and captured segments, its writing key first.
	BackupKeys []string `json:"backupKeys,omitempty"`
	// Trust are the SHA-256 fingerprints of the CAs the agent trusts,
	// and EtcdTrust those its etcd was started with.
	Trust     []string `json:"trust,omitempty"`
	EtcdTrust []string `json:"etcdTrust,omitempty"`
	// Transfer is the agent's download in progress (a restore's backup).
	Transfer *spec.Transfer `json:"transfer,omitempty"`
}

// Agent roles in AgentStatus.Role.
const (
	RoleStandby = "standby"
	RolePending = "pending"
	RoleLeader  = "leader"
	RoleLearner = "learner"
	RoleMember  = "member"
)

// ClusterStatus is the output of `status`.
type ClusterStatus struct {
	Spec *spec.ClusterSpec `json:"spec,omitempty"`
	// Leader is the manager leader: the agent that steers the cluster.
	Leader string `json:"leader,omitempty"`
	// EtcdLeader is the node whose etcd member is the raft leader.
	EtcdLeader string `json:"etcdLeader,omitempty"`
	// ClusterVersion is the version the members agree to speak, which lags
	// behind the members' own during a version change.
	ClusterVersion string        `json:"clusterVersion,omitempty"`
	Agents         []AgentStatus `json:"agents"`
	// Unreachable lists discovered addresses that did not answer.
	Unreachable []string `json:"unreachable,omitempty"`
	// Failing are the leader's cluster changes that keep failing.
	Failing []string `json:"failing,omitempty"`
	// Warnings are the leader's lines about states a person should know
	// of, such as a stalled peer URL switch.
	Warnings []string `json:"warnings,omitempty"`
	// Maintenance is the leader's record of defragmentations, hash
	// comparisons and members rebuilt since it began to lead, and etcd's
	// raised alarms.
	Maintenance *peer.Maintenance `json:"maintenance,omitempty"`
	// CARotation is the phase of the CA rotation in progress, if any.
	CARotation string `json:"caRotation,omitempty"`
	// Revoked are the nodes the store's revocation list names
	// (revoke-node).
	Revoked []string `json:"revoked,omitempty"`
	// RestoreDrills and BackupFailure are the store's records of the
	// restore drills and of the last failed backup.
	RestoreDrills *spec.DrillRecord   `json:"restoreDrills,omitempty"`
	BackupFailure *spec.BackupFailure `json:"lastBackupFailure,omitempty"`
	// StoreOnly is set when no agent answered: NewestBackup,
	// Restorable and Commands are then what the store says.
	StoreOnly    bool         `json:"storeOnly,omitempty"`
	NewestBackup string       `json:"newestBackup,omitempty"`
	Restorable   *time.Time   `json:"restorablePoint,omitempty"`
	Commands     []CommandRow `json:"commands,omitempty"`
}

// CommandRow is one queued command in `list-commands`.
type CommandRow struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
	Backup string `json:"backup,omitempty"`
	Phase  string `json:"phase,omitempty"`
	// Check is a restore's: verified or unverified (see docs).
	Check   string `json:"check,omitempty"`
	Queued  string `json:"queued,omitempty"`
	Updated string `json:"updated,omitempty"`
	// Expires is when the command fails instead of starting, if it has
	// not started by then.
	Expires string `json:"expires,omitempty"`
}

// BackupRow is one backup in `list-backups`, oldest first.
type BackupRow struct {
	Name           string  `json:"name"`
	EtcdVersion    string  `json:"etcdVersion"`
	Size           int64   `json:"size"`
	CompressedSize int64   `json:"compressedSize"`
	Revision       int64   `json:"revision"`
	AgeSeconds     float64 `json:"ageSeconds"`
	// Kind is why the backup was taken (periodic, pre-change, on-demand,
	// restored), when its meta says.
	Kind string `json:"kind,omitempty"`
	// EncryptionKeyID names the key the backup is encrypted with, when it
	// is.
	EncryptionKeyID string `json:"encryptionKeyId,omitempty"`
}
