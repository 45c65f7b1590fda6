package pki

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Revoking node certificates. etcd-manager-ctl revoke-node writes the
// node to StoreRevokedKey with the serial numbers of every certificate
// issued to it, which the issuing agents record under StoreIssuedPrefix
// before they use them. Agents read the list every cycle: their peer API
// refuses the node's certificates, of any serial (by its node ID) and
// any role (by serial); they stop dialling it; the leader removes its
// member; and etcd's own ports refuse the serials through the CRL file
// each agent writes beside its certificate (--peer-crl-file,
// --client-crl-file), which etcd reads at every new connection.

// Keys of revocation in the backup store.
const (
	StoreRevokedKey   = "pki/revoked"
	StoreIssuedPrefix = "pki/issued/"
)

// Bounds of what is read back: far above any real list.
const (
	// MaxRevokedSize bounds the revocation list object.
	MaxRevokedSize = 256 << 10
	// MaxRevokedNodes bounds the nodes it names, MaxRevokedSerials the
	// serials of one node.
	MaxRevokedNodes   = 1000
	MaxRevokedSerials = 1000
	maxNodeIDLen      = 128
	maxReasonLen      = 512
	// A serial is at most 20 bytes (RFC 5280), 40 hex digits.
	maxSerialHexLen = 40
)

// ErrBadRevocations means the store's revocation list does not read.
var ErrBadRevocations = errors.New("pki: invalid revocation list")

// Revocations is the store's revocation list.
type Revocations struct {
	Nodes []RevokedNode `json:"nodes"`
}

// RevokedNode is a node whose certificates are refused.
type RevokedNode struct {
	NodeID    string    `json:"nodeId"`
	RevokedAt time.Time `json:"revokedAt"`
	Reason    string    `json:"reason,omitempty"`
	// Serials are the node's certificates that the store recorded, in
	// lower-case hex without separators (SerialHex).
	Serials []string `json:"serials,omitempty"`
}

// SerialHex is a certificate serial as revocation lists and issue
// records name it.
func SerialHex(n *big.Int) string { return n.Text(16) }

// CheckNodeID refuses what cannot be a node ID: node IDs are generated
// (base64url) or given (a pod's name), and name store keys.
func CheckNodeID(id string) error {
	if id == "" || len(id) > maxNodeIDLen {
		return fmt.Errorf("pki: a node ID has 1 to %d characters, not %d", maxNodeIDLen, len(id))
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("pki: node ID %q: only letters, digits, '-', '_' and '.' may appear in one", id)
		}
	}
	if id == "." || id == ".." {
		return fmt.Errorf("pki: %q is no node ID", id)
	}
	return nil
}

func checkSerialHex(s string) error {
	if !ValidSerialHex(s) {
		return fmt.Errorf("serial %q is not 1 to %d lower-case hex digits", s, maxSerialHexLen)
	}
	return nil
}

// ValidSerialHex reports whether s has the form of SerialHex.
func ValidSerialHex(s string) bool {
	return s != "" && len(s) <= maxSerialHexLen && strings.TrimLeft(s, "0123456789abcdef") == ""
}

// LoadStoreRevocations reads the store's revocation list, at most
// MaxRevokedSize bytes of it; a missing one revokes no one. isNotFound
// tells the store's missing-object error apart.
func LoadStoreRevocations(ctx context.Context, s Store, isNotFound func(error) bool) (Revocations, error) {
	data, err := s.ReadMax(ctx, StoreRevokedKey, MaxRevokedSize)
	if isNotFound(err) {
		return Revocations{}, nil
	}
	if err != nil {
		return Revocations{}, err
	}
	r, err := ParseRevocations(data)
	if err != nil {
		return Revocations{}, fmt.Errorf("%w (%s in the store: fix or remove it)", err, StoreRevokedKey)
	}
	return r, nil
}

// ParseRevocations reads and checks a revocation list.
func ParseRevocations(data []byte) (Revocations, error) {
	var r Revocations
	if len(data) > MaxRevokedSize {
		return Revocations{}, fmt.Errorf("%w: %d bytes, over %d", ErrBadRevocations, len(data), MaxRevokedSize)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return Revocations{}, fmt.Errorf("%w: %v", ErrBadRevocations, err)
	}
	if err := r.Validate(); err != nil {
		return Revocations{}, err
	}
	return r, nil
}

// Validate checks the list's bounds and forms.
func (r Revocations) Validate() error {
	if len(r.Nodes) > MaxRevokedNodes {
		return fmt.Errorf("%w: %d nodes, over %d", ErrBadRevocations, len(r.Nodes), MaxRevokedNodes)
	}
	seen := map[string]bool{}
	for _, n := range r.Nodes {
		if err := CheckNodeID(n.NodeID); err != nil {
			return fmt.Errorf("%w: %v", ErrBadRevocations, err)
		}
		if seen[n.NodeID] {
			return fmt.Errorf("%w: node %s is listed twice", ErrBadRevocations, n.NodeID)
		}
		seen[n.NodeID] = true
		if len(n.Reason) > maxReasonLen {
			return fmt.Errorf("%w: node %s: a reason of %d bytes, over %d", ErrBadRevocations, n.NodeID, len(n.Reason), maxReasonLen)
		}
		if len(n.Serials) > MaxRevokedSerials {
			return fmt.Errorf("%w: node %s: %d serials, over %d", ErrBadRevocations, n.NodeID, len(n.Serials), MaxRevokedSerials)
		}
		for _, s := range n.Serials {
			if err := checkSerialHex(s); err != nil {
				return fmt.Errorf("%w: node %s: %v", ErrBadRevocations, n.NodeID, err)
			}
		}
	}
	return nil
}

// ReadRevocationsFile reads a revocation list an agent saved (see
// Marshal), at most MaxRevokedSize bytes of it.
func ReadRevocationsFile(path string) (Revocations, error) {
	data, err := readFileMax(path, MaxRevokedSize)
	if err != nil {
		return Revocations{}, err
	}
	return ParseRevocations(data)
}

// Marshal is the list as the store keeps it.
func (r Revocations) Marshal() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.MarshalIndent(r, "", "  ")
}

// Node returns the entry of a revoked node.
func (r Revocations) Node(id string) (RevokedNode, bool) {
	i := slices.IndexFunc(r.Nodes, func(n RevokedNode) bool { return n.NodeID == id })
	if i < 0 {
		return RevokedNode{}, false
	}
	return r.Nodes[i], true
}

// Revoke adds node to the list, or adds serials to its entry; the first
// revocation's time and reason stay.
func (r Revocations) Revoke(node RevokedNode) Revocations {
	out := Revocations{Nodes: slices.Clone(r.Nodes)}
	i := slices.IndexFunc(out.Nodes, func(n RevokedNode) bool { return n.NodeID == node.NodeID })
	if i < 0 {
		node.Serials = sortedUnique(node.Serials)
		out.Nodes = append(out.Nodes, node)
		return out
	}
	n := out.Nodes[i]
	n.Serials = sortedUnique(append(slices.Clone(n.Serials), node.Serials...))
	out.Nodes[i] = n
	return out
}

func sortedUnique(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return slices.Compact(c)
}

// Serials are every serial the list names, sorted.
func (r Revocations) Serials() []string {
	var out []string
	for _, n := range r.Nodes {
		out = append(out, n.Serials...)
	}
	slices.Sort(out)
	return out
}

// IDSet is the revoked node IDs as a set; nil for none.
func (r Revocations) IDSet() map[string]bool {
	if len(r.Nodes) == 0 {
		return nil
	}
	ids := make(map[string]bool, len(r.Nodes))
	for _, n := range r.Nodes {
		ids[n.NodeID] = true
	}
	return ids
}

// AddedSince are the nodes r revokes that prev did not.
func (r Revocations) AddedSince(prev Revocations) []string {
	var out []string
	for _, n := range r.Nodes {
		if _, ok := prev.Node(n.NodeID); !ok {
			out = append(out, n.NodeID)
		}
	}
	return out
}

// NodeIDs are the revoked nodes.
func (r Revocations) NodeIDs() []string {
	ids := make([]string, 0, len(r.Nodes))
	for _, n := range r.Nodes {
		ids = append(ids, n.NodeID)
	}
	return ids
}

// Refuses says why c may not be used, or nil: a node certificate whose
// common name is a revoked node, or any certificate whose serial is
// listed.
func (r Revocations) Refuses(c *x509.Certificate) error {
	serial := SerialHex(c.SerialNumber)
	for _, n := range r.Nodes {
		if PeerRole(c) == RoleNode && c.Subject.CommonName == n.NodeID {
			return fmt.Errorf("pki: node %s is revoked (since %s): its certificates are refused", n.NodeID, n.RevokedAt.UTC().Format(time.RFC3339))
		}
		if slices.Contains(n.Serials, serial) {
			return fmt.Errorf("pki: certificate %q (serial %s) is revoked with node %s", c.Subject.CommonName, serial, n.NodeID)
		}
	}
	return nil
}

// CRL is the list as a certificate revocation list signed by ca, in DER,
// as etcd's --peer-crl-file and --client-crl-file take it: every listed
// serial of every node. etcd refuses a new connection whose certificate's
// serial it lists.
func (r Revocations) CRL(ca *CA, now time.Time) ([]byte, error) {
	tmpl := &x509.RevocationList{
		Number:     big.NewInt(now.Unix()),
		ThisUpdate: now.Add(-time.Minute),
		// etcd does not look at NextUpdate; other readers may.
		NextUpdate: now.Add(365 * 24 * time.Hour),
	}
	for _, n := range r.Nodes {
		for _, s := range n.Serials {
			serial, ok := new(big.Int).SetString(s, 16)
			if !ok {
				return nil, fmt.Errorf("pki: serial %q of node %s is not hex", s, n.NodeID)
			}
			tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
				x509.RevocationListEntry{SerialNumber: serial, RevocationTime: n.RevokedAt})
		}
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign the revocation list: %w", err)
	}
	return der, nil
}

// RevocationSet holds the revocation list in force, shared by the
// servers and clients that check certificates; safe for concurrent use.
// A nil set refuses nothing.
type RevocationSet struct{ p atomic.Pointer[Revocations] }

// Set puts r in force.
func (s *RevocationSet) Set(r Revocations) { s.p.Store(&r) }

// Get is the list in force.
func (s *RevocationSet) Get() Revocations {
	if s == nil {
		return Revocations{}
	}
	if r := s.p.Load(); r != nil {
		return *r
	}
	return Revocations{}
}

// Refuses is Revocations.Refuses of the list in force.
func (s *RevocationSet) Refuses(c *x509.Certificate) error {
	if s == nil {
		return nil
	}
	r := s.p.Load()
	if r == nil {
		return nil
	}
	return r.Refuses(c)
}

// NodeRevoked reports whether the list in force names node.
func (s *RevocationSet) NodeRevoked(node string) bool {
	_, ok := s.Get().Node(node)
	return ok
}

// WithRevocations makes cfg, a client's, refuse a server whose
// certificate set refuses, after cfg's own checks: an agent does not
// call a revoked node, nor take its answers.
func WithRevocations(cfg *tls.Config, set *RevocationSet) *tls.Config {
	prev := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if prev != nil {
			if err := prev(cs); err != nil {
				return err
			}
		}
		if len(cs.PeerCertificates) == 0 {
			return nil
		}
		return set.Refuses(cs.PeerCertificates[0])
	}
	return cfg
}
