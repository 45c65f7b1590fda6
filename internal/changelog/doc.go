// Package changelog is continuous capture and point-in-time restore: the
// leading agent follows every change of etcd with a watch and writes it,
// in segments of whole revisions, under the store's wal/ prefix, which
// kops tools ignore; a restore applies the segments to a full backup's
// snapshot, offline, up to a chosen revision.
//
// A segment object is a header, one line of JSON, then a body of records:
//
//	R  uvarint revision, varint unix-ns observed, uvarint n,
//	   n × (byte 0 put | 1 tombstone, uvarint length, the bucket value)
//	G  uvarint revision, varint lease ID, varint granted TTL (s; -1 unknown)
//	X  uvarint revision, varint lease ID: gone by that revision
//	H  uvarint revision, uvarint keys, 16 bytes sum: the digest of every
//	   key live at that revision, read from etcd itself (see Digest)
//
// A put's bucket value is the mvccpb.KeyValue as etcd stores it; a
// tombstone's is the KeyValue holding the key only. Both are what the
// watch delivers, so applying a record writes exactly the bytes the live
// etcd wrote, and HashKV agrees.
//
// The revisions of a timeline form a hash chain: each revision record's
// chain value is sha256(previous chain value, the record's bytes without
// the time it was observed; format 1 included it). So two writers of the
// same revisions, which observe them at different times, agree. A
// header records the chain value before its first revision (Prev) and
// after its last (Chain), so a missing, reordered or altered segment
// breaks the chain, whichever way the segments were cut or merged, and
// whichever leader wrote them. Lease records come from polling, which two
// leaders do differently; they are outside the chain, covered by their
// segment's sha256.
//
// With an encryption key (see package crypt), the body is encrypted with
// age as it is uploaded: the header stays plaintext, so that listing,
// resuming, pruning and merging plans need no key, and names the key;
// such a segment is of FormatEncrypted. The spool on local disk stays
// plaintext, as etcd's own data beside it is.
package changelog
