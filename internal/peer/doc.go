// Package peer is the agents' peer API, a small gRPC service on
// --address:--peer-port, and the discovery providers that tell an agent
// where its peers are.
//
// Messages are plain Go structs carried with a JSON codec, so the contract
// lives in this file and needs no code generation. Transport security is a
// grpc credentials option: mutual TLS with certificates from the cluster's
// CA (see package pki), plaintext with --insecure.
package peer
