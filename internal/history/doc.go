// Package history reads what the store can restore: each timeline's
// backups and captured runs, the ranges they reach, the chain of restores
// that made each timeline from another, and a target (a revision, a time,
// the newest point) resolved to the backup to start from and the point to
// bring it to.
package history
