// Package spec holds the desired cluster spec and the other objects kept in
// the backup store, with JSON that matches the etcd-manager store format:
// camelCase names, int32 values as numbers, and int64 values read whether
// they arrive as JSON strings or numbers.
package spec
