// Package crypt encrypts what etcd-manager writes to the backup store
// (full backups and captured segments) on the client side, with age
// (filippo.io/age): the object is encrypted to the recipient of an age
// identity (X25519, or age's post-quantum hybrid), and its payload is
// ChaCha20-Poly1305 in 64 KiB chunks (age's STREAM construction), which
// authenticates every chunk, detects a truncated object, and encrypts and
// decrypts as a stream in constant memory.
//
// Objects record which key they need as an Info, {"scheme":"age",
// "keyId":"age:<16 hex>"}: the key ID is a fingerprint of the key's
// public recipient, stable and not secret, so a reader knows which key
// it lacks before it reads anything.
//
// A Key never prints its secret: its String, GoString and LogValue are its
// ID.
package crypt
