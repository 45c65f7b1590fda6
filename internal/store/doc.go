// Package store is the backup store: the source of truth for the cluster
// spec, the creation marker, the command queue and the backups whenever etcd
// is down. All access goes through gocloud.dev/blob, opened from a URL.
//
// The layout follows the etcd-manager backup-store format:
//
//	control/etcd-cluster-spec      desired spec (JSON)
//	control/etcd-cluster-created   present => never create a new empty cluster
package store
