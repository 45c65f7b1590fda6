// Package operatorapi is the small API the Kubernetes operator calls on
// the agents, beside their peer API and on the same port, over mutual TLS:
// the store's spec read and written, a command queued and the queue read,
// the backups listed, and leadership handed on before a pod is replaced.
// The agents carry the calls out with the store credentials they hold, so
// the operator needs neither those nor pods/exec.
//
// The operator authenticates with an operator certificate for the cluster
// (role pki.RoleOperator, carrying pki.OperatorMarker), issued from the
// cluster's CA. The agents take these calls from that certificate and
// from no other; the peer API's node calls refuse it (see package peer).
package operatorapi
