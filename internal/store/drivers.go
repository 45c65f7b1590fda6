package store

// The blob drivers for the cloud schemes register their URL openers here,
// so every binary that opens a store understands all of them.
import (
	_ "gocloud.dev/blob/azureblob" // azblob://container
	_ "gocloud.dev/blob/gcsblob"   // gs://bucket
	_ "gocloud.dev/blob/s3blob"    // s3://bucket
)
