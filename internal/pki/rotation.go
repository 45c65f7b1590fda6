package pki

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A CA rotation replaces the cluster's CA with a new one while the
// cluster serves. It is recorded in the store (StoreRotation) and goes
// through these phases; the ctl starts it and opens its two gates, and
// the leader does the rest, one member at a time:
//
//	trust-both  every node comes to trust the old CA and the new one:
//	            its agent at once, its etcd by a rolling restart
//	trusted     (gate) clients are to trust both CAs too, before the
//	            nodes' certificates change: rotate-ca continue
//	reissue     the new CA issues; every node gets a new key and a
//	            certificate from it
//	reissued    (gate) clients are to switch to certificates from the
//	            new CA: rotate-ca finish
//	drop-old    every node trusts the new CA alone, etcd by a rolling
//	            restart; then the record is removed
//
// The store's pki/ca.key is always the CA that issues: the old one until
// rotate-ca continue writes the new one there (kept meanwhile in
// StoreNextCAKey).
const (
	PhaseTrustBoth = "trust-both"
	PhaseTrusted   = "trusted"
	PhaseReissue   = "reissue"
	PhaseReissued  = "reissued"
	PhaseDropOld   = "drop-old"
)

// Phases are the rotation's phases in order.
var Phases = []string{PhaseTrustBoth, PhaseTrusted, PhaseReissue, PhaseReissued, PhaseDropOld}

// Store keys of a rotation.
const (
	StoreRotation  = "pki/rotation.json"
	StoreNextCAKey = "pki/next-ca.key"
)

// MaxRotationSize bounds the read of the rotation record: two CA
// certificates in PEM and a few fields.
const MaxRotationSize = 64 << 10

// RotationFormat is the record's format version; a record of a newer one
// is left alone.
const RotationFormat = 1

// ErrBadRotation means the rotation record cannot be used.
var ErrBadRotation = errors.New("pki: invalid CA rotation record")

// Rotation is the record of a CA rotation in progress.
type Rotation struct {
	Format int    `json:"format"`
	Phase  string `json:"phase"`
	// OldCA and NewCA are the two CAs' certificates in PEM.
	OldCA   string    `json:"oldCA"`
	NewCA   string    `json:"newCA"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`

	oldCert, newCert *x509.Certificate
}

// NewRotation is the record of a rotation from old to new, starting now.
func NewRotation(old, new *x509.Certificate, now time.Time) *Rotation {
	return &Rotation{Format: RotationFormat, Phase: PhaseTrustBoth, OldCA: string(Bundle(old)), NewCA: string(Bundle(new)),
		Started: now.UTC(), Updated: now.UTC(), oldCert: old, newCert: new}
}

// DecodeRotation reads and checks a rotation record.
func DecodeRotation(data []byte) (*Rotation, error) {
	if len(data) > MaxRotationSize {
		return nil, fmt.Errorf("%w: %d bytes, over %d", ErrBadRotation, len(data), MaxRotationSize)
	}
	var r Rotation
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRotation, err)
	}
	if r.Format > RotationFormat {
		return nil, fmt.Errorf("%w: format %d is newer than this etcd-manager's %d; upgrade it", ErrBadRotation, r.Format, RotationFormat)
	}
	if PhaseIndex(r.Phase) < 0 {
		return nil, fmt.Errorf("%w: unknown phase %q", ErrBadRotation, r.Phase)
	}
	var err error
	if r.oldCert, err = oneCA([]byte(r.OldCA)); err != nil {
		return nil, fmt.Errorf("%w: oldCA: %w", ErrBadRotation, err)
	}
	if r.newCert, err = oneCA([]byte(r.NewCA)); err != nil {
		return nil, fmt.Errorf("%w: newCA: %w", ErrBadRotation, err)
	}
	if bytes.Equal(r.oldCert.Raw, r.newCert.Raw) {
		return nil, fmt.Errorf("%w: the old and the new CA are the same", ErrBadRotation)
	}
	return &r, nil
}

func oneCA(data []byte) (*x509.Certificate, error) {
	certs, err := ParseCertsPEM(data)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 || !certs[0].IsCA {
		return nil, errors.New("want exactly one CA certificate")
	}
	return certs[0], nil
}

// Encode is the record as stored.
func (r *Rotation) Encode() []byte {
	data, _ := json.MarshalIndent(r, "", "  ")
	return append(data, '\n')
}

// PhaseIndex is the position of phase in Phases, -1 for none.
func PhaseIndex(phase string) int {
	for i, p := range Phases {
		if p == phase {
			return i
		}
	}
	return -1
}

// Old and New are the two CAs' certificates.
func (r *Rotation) Old() *x509.Certificate { return r.oldCert }
func (r *Rotation) New() *x509.Certificate { return r.newCert }

// Trust is the PEM of the CAs every node is to trust in the record's
// phase: both until drop-old, then the new one alone.
func (r *Rotation) Trust() []byte {
	if r.Phase == PhaseDropOld {
		return Bundle(r.newCert)
	}
	return Bundle(r.oldCert, r.newCert)
}

// LoadRotation reads the store's rotation record, nil when there is
// none.
func LoadRotation(ctx context.Context, s Store, isNotFound func(error) bool) (*Rotation, error) {
	data, err := s.ReadMax(ctx, StoreRotation, MaxRotationSize)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pki: read %s: %w", StoreRotation, err)
	}
	r, err := DecodeRotation(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, StoreRotation)
	}
	return r, nil
}

// StoreTrust is what the store says a node is to use: the CA that issues
// its certificate, and the PEM of the CAs it trusts.
type StoreTrust struct {
	CA    *CA
	Trust []byte
	// Rotation is the rotation in progress, nil for none.
	Rotation *Rotation
}

// LoadStoreTrust reads the issuing CA (as LoadStoreCA) and the rotation
// record, if any. Without a rotation the CA trusts itself alone. The
// issuing CA must be one of the rotation's: a record that names neither
// is refused. A record that cannot be used is an error wrapping
// ErrBadRotation, returned with the CA trusting itself alone, for a
// caller that would rather go on with that (the ctl's status).
func LoadStoreTrust(ctx context.Context, s Store, isNotFound func(error) bool, now time.Time) (StoreTrust, error) {
	ca, err := LoadStoreCA(ctx, s, isNotFound, now)
	if err != nil {
		return StoreTrust{}, err
	}
	alone := StoreTrust{CA: ca, Trust: ca.CertPEM}
	r, err := LoadRotation(ctx, s, isNotFound)
	if err != nil || r == nil {
		return alone, err
	}
	fp := Fingerprint(ca.Cert)
	if fp != Fingerprint(r.Old()) && fp != Fingerprint(r.New()) {
		return alone, fmt.Errorf("%w: %s is neither of its CAs (%s, then %s)", ErrBadRotation, Describe(ca.Cert), Describe(r.Old()), Describe(r.New()))
	}
	if fp != Fingerprint(r.New()) && PhaseIndex(r.Phase) >= PhaseIndex(PhaseReissue) {
		return alone, fmt.Errorf("%w: at phase %s, %s still holds the old CA", ErrBadRotation, r.Phase, StoreCAKey)
	}
	return StoreTrust{CA: ca, Trust: r.Trust(), Rotation: r}, nil
}

// Step is what the record's phase asks for: whether members restart
// etcd to trust other CAs, the phase that follows once every node is
// there (empty: the rotation ends), or, for a gate, the ctl command it
// waits for instead.
func (r *Rotation) Step() (rollEtcd bool, next, gate string) {
	switch r.Phase {
	case PhaseTrustBoth:
		return true, PhaseTrusted, ""
	case PhaseTrusted:
		return false, "", "rotate-ca continue"
	case PhaseReissue:
		return false, PhaseReissued, ""
	case PhaseReissued:
		return false, "", "rotate-ca finish"
	}
	return true, "", "" // drop-old
}
