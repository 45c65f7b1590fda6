// Package secretfile checks that a file holding a secret (an encryption
// key, a CA's key) is kept private: readable by the agent's user alone,
// or a Kubernetes Secret mounted as Kubernetes mounts it for a pod that
// runs as a user other than root.
package secretfile
