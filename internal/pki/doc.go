// Package pki is etcd-manager's certificate authority: a CA supplied as
// files or generated once into the backup store, the certificates it
// issues to nodes (server and client, for the peer API and etcd) and to
// operators (client only), their renewal, and TLS configurations that
// pick up a renewed certificate without a restart.
package pki
