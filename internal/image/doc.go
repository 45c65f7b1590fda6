// Package image builds the project's container image without a Docker
// engine: one layer holding the agent, the ctl and every statically
// linked etcd, written as a docker-archive tarball (what docker load,
// podman load and ctr images import accept). The same inputs give the
// same image digest: entries are sorted, owned by root and stamped with
// one fixed time, and the config carries no build time.
package image
