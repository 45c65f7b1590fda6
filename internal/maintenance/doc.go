// Package maintenance carries out the upkeep etcd needs beside its
// membership: compaction by the spec's policy, held back by continuous
// capture until availability wins. The planner decides each step
// (plan.PlanCompaction); this package samples etcd, executes, and keeps
// the figures.
package maintenance
