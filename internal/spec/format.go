package spec

import (
	"errors"
	"fmt"
	"time"
)

// FormatVersion is the format of the records this etcd-manager writes to
// the store that are its own (command statuses, lock terms, discovery
// records, procedure choices, and commands queued by its ctl). A record
// without a format field is format 0: written before formats existed, or
// by kops's etcd-manager. A newer etcd-manager that changes the meaning of
// a record raises the format; an older one never acts on such a record.
const FormatVersion = 3

// The formats written. A record is written in the oldest format that
// holds its meaning, so that an older etcd-manager still reads what it
// can act on correctly.
const (
	// FormatBase is every record whose meaning is unchanged since formats
	// began.
	FormatBase = 1
	// FormatPointInTime is a restore command that names a point in time
	// (toRevision): an older etcd-manager would restore the plain backup
	// instead, so it must refuse the command.
	FormatPointInTime = 2
	// FormatRequireDigest is a restore command that refuses an unverified
	// point (requireDigest): an older etcd-manager would apply it
	// unchecked.
	FormatRequireDigest = 3
)

// ErrNewerFormat means a record was written by a newer etcd-manager than
// this one: it says so and waits to be upgraded, rather than act on
// something it may misread.
var ErrNewerFormat = errors.New("spec: written by a newer etcd-manager")

// CheckFormat returns an error wrapping ErrNewerFormat when format is
// newer than this etcd-manager understands. what names the record.
func CheckFormat(what string, format int) error {
	if format > FormatVersion {
		return fmt.Errorf("%w: %s has format %d, this etcd-manager understands formats up to %d; upgrade this agent (or the ctl)",
			ErrNewerFormat, what, format, FormatVersion)
	}
	return nil
}

// FutureSkew is how far after the reader's clock a record in the store
// (a discovery record, a backup) may be dated. Anyone who can write the
// store could date one in the future, where it would stay the newest, or
// fresh, forever; past the skew it is left out, and the reader says so.
const FutureSkew = time.Minute
