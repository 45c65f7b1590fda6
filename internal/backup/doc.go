// Package backup takes full, verified etcd backups into the backup store
// and lists them. The layout is etcd-manager's:
//
//	<name>/etcd.backup.gz      gzip of an etcd v3 snapshot db
//	<name>/_etcd_backup.meta   JSON, written last: a backup without it does not exist
//
// where <name> is <RFC3339 UTC>-<6-digit sequence>. With an encryption key
// (see package crypt), etcd.backup.gz is the gzip encrypted with age, and
// the meta names the key; the meta itself stays plaintext.
package backup
