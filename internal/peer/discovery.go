package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Record is one agent as discovery knows it.
type Record struct {
	// Format is the record's format (see spec.FormatVersion).
	Format      int    `json:"format,omitempty"`
	NodeID      string `json:"nodeId,omitempty"`
	ClusterName string `json:"clusterName,omitempty"`
	// Address is the peer API's host:port.
	Address string `json:"address"`
	// Updated is when the agent last published the record.
	Updated time.Time `json:"updated,omitzero"`
	// Etcd is what the agent's etcd looked like when it published: the
	// evidence a recover-quorum weighs about agents it cannot reach.
	Etcd *EtcdReport `json:"etcd,omitempty"`
	// EtcdVersions are the etcd versions installed on the agent's node
	// (under its --etcd-bin-dir), oldest first: what configure-cluster
	// checks a version against, on a machine that need have none. At
	// most MaxReportedVersions, the newest; none from agents older than
	// this field.
	EtcdVersions []string `json:"etcdVersions,omitempty"`
}

// MaxReportedVersions bounds Record.EtcdVersions, so that a record stays
// far below the size at which readers refuse it (16 KiB): a node with
// more installs reports its newest.
const MaxReportedVersions = 64

// bounded is the record as it is published: at most MaxReportedVersions
// versions, the newest.
func (r Record) bounded() Record {
	if n := len(r.EtcdVersions); n > MaxReportedVersions {
		r.EtcdVersions = r.EtcdVersions[n-MaxReportedVersions:]
	}
	return r
}

// HasEtcd says whether the agent reported etcd v installed on its node.
// known is false when its record cannot tell: it reports no versions (an
// agent older than Record.EtcdVersions), or v is older than the oldest of
// a list cut at MaxReportedVersions.
func (r Record) HasEtcd(v spec.Version) (has, known bool) {
	var oldest *spec.Version
	for _, s := range r.EtcdVersions {
		got, err := spec.ParseVersion(s)
		if err != nil {
			continue
		}
		if got.Compare(v) == 0 {
			return true, true
		}
		if oldest == nil || got.Compare(*oldest) < 0 {
			oldest = &got
		}
	}
	if oldest == nil || (len(r.EtcdVersions) >= MaxReportedVersions && v.Compare(*oldest) < 0) {
		return false, false
	}
	return false, true
}

// EtcdReport is an agent's membership and its etcd's view, as published
// in its record.
type EtcdReport struct {
	// ClusterToken is the agent's membership, empty for a standby.
	ClusterToken string `json:"clusterToken,omitempty"`
	HasData      bool   `json:"hasData,omitempty"`
	// Healthy is whether its etcd answered; RaftLeader the leader it knew.
	Healthy    bool   `json:"healthy,omitempty"`
	RaftLeader uint64 `json:"raftLeader,omitempty"`
	// NoLeaderFor is how long its etcd, a member, had seen no leader
	// without a break.
	NoLeaderFor time.Duration `json:"noLeaderFor,omitempty"`
}

// Discovery finds the agents of a cluster. Publish announces this agent
// (a no-op for providers that are configured from outside, such as static
// lists and DNS); Poll returns every agent it knows, this one included.
// Both are called from the agent's loop only.
type Discovery interface {
	Publish(ctx context.Context, self Record) error
	Poll(ctx context.Context) ([]Record, error)
}

// ErrBadDiscovery means the --discovery value cannot be used.
var ErrBadDiscovery = errors.New("peer: invalid --discovery")

// BlobStore is the part of the backup store the store provider needs.
type BlobStore interface {
	Write(ctx context.Context, key string, data []byte) error
	// ReadMax reads an object, refusing one larger than max bytes.
	ReadMax(ctx context.Context, key string, max int64) ([]byte, error)
	List(ctx context.Context, prefix, delimiter string) ([]string, error)
}

// maxRecordSize bounds a record read from the store: far above any valid
// one.
const maxRecordSize = 16 << 10

// Bounds on what is read of the discovery records: anyone who can write
// the store or the shared folder could plant records without end, or
// date one in the future, where it would stay fresh forever (see
// spec.FutureSkew).
const DefaultMaxRecords = 1000

// ReadLimits bound a read of the discovery records.
type ReadLimits struct {
	// Max is the most records read (0: DefaultMaxRecords); past it the
	// rest are left out, with an error that says so.
	Max int
	// A record dated more than spec.FutureSkew after Now is left out,
	// with an error that says so; a zero Now checks nothing.
	Now time.Time
}

func (l ReadLimits) max() int {
	if l.Max <= 0 {
		return DefaultMaxRecords
	}
	return l.Max
}

// future says why a record dated updated is refused, or "".
func (l ReadLimits) future(updated time.Time) string {
	if l.Now.IsZero() || updated.IsZero() || !updated.After(l.Now.Add(spec.FutureSkew)) {
		return ""
	}
	return fmt.Sprintf("dated %s, more than %s after this agent's clock: left out", updated.UTC().Format(time.RFC3339), spec.FutureSkew)
}

// Resolver is the part of net.Resolver the DNS provider needs.
type Resolver interface {
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// DiscoveryOptions hold what the providers may need.
type DiscoveryOptions struct {
	// Store backs --discovery=store; opened lazily by the caller.
	Store func(ctx context.Context) (BlobStore, error)
	// Resolver backs --discovery=dns:NAME; nil means the system resolver.
	Resolver Resolver
	// PeerPort is used for DNS A records, which carry no port.
	PeerPort int
	// MaxAge drops records not refreshed for this long (store and
	// directory providers); zero keeps all.
	MaxAge time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxRecords bounds how many records are read (0:
	// DefaultMaxRecords).
	MaxRecords int
}

// DiscoveryPrefix is where --discovery=store keeps records in the store.
const DiscoveryPrefix = "discovery/"

// ParseDiscovery builds the provider named by spec:
//
//	store                     records under discovery/ in the backup store (default)
//	file:///tmp/discovery     one record file per agent in a shared directory
//	static:HOST:PORT,...      a fixed seed list
//	dns:NAME                  SRV records of NAME, or else its A records with the peer port
func ParseDiscovery(spec string, o DiscoveryOptions) (Discovery, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	switch {
	case spec == "" || spec == "store":
		if o.Store == nil {
			return nil, fmt.Errorf("%w %q: no backup store", ErrBadDiscovery, spec)
		}
		return &storeDiscovery{open: o.Store, maxAge: o.MaxAge, now: o.Now, max: o.MaxRecords}, nil
	case strings.HasPrefix(spec, "file://"):
		dir := strings.TrimPrefix(spec, "file://")
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("%w %q: a file URL needs an absolute path, as in file:///tmp/discovery", ErrBadDiscovery, spec)
		}
		return &dirDiscovery{dir: filepath.Clean(dir), maxAge: o.MaxAge, now: o.Now, max: o.MaxRecords}, nil
	case strings.HasPrefix(spec, "static:"):
		var recs []Record
		for _, addr := range strings.Split(strings.TrimPrefix(spec, "static:"), ",") {
			addr = strings.TrimSpace(addr)
			if addr == "" {
				continue
			}
			if host, port, err := net.SplitHostPort(addr); err != nil || port == "" || host == "" || strings.Contains(host, "/") {
				return nil, fmt.Errorf("%w %q: %q is not HOST:PORT", ErrBadDiscovery, spec, addr)
			}
			recs = append(recs, Record{Address: addr})
		}
		if len(recs) == 0 {
			return nil, fmt.Errorf("%w %q: the static list is empty", ErrBadDiscovery, spec)
		}
		return staticDiscovery(recs), nil
	case strings.HasPrefix(spec, "dns:"):
		name := strings.TrimPrefix(spec, "dns:")
		if name == "" {
			return nil, fmt.Errorf("%w %q: no DNS name", ErrBadDiscovery, spec)
		}
		r := o.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		return &dnsDiscovery{name: name, port: o.PeerPort, r: r}, nil
	default:
		return nil, fmt.Errorf("%w %q: use store, file:///DIR, static:HOST:PORT,... or dns:NAME", ErrBadDiscovery, spec)
	}
}

type staticDiscovery []Record

func (s staticDiscovery) Publish(context.Context, Record) error { return nil }
func (s staticDiscovery) Poll(context.Context) ([]Record, error) {
	return append([]Record(nil), s...), nil
}

// dirDiscovery keeps one JSON file per agent in a shared directory, as in
// the original etcd-manager walkthrough.
type dirDiscovery struct {
	dir    string
	maxAge time.Duration
	now    func() time.Time
	max    int
}

func (d *dirDiscovery) Publish(_ context.Context, self Record) error {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return fmt.Errorf("peer: discovery dir: %w", err)
	}
	self = self.bounded()
	self.Updated = d.now().UTC()
	self.Format = spec.FormatBase
	data, err := json.Marshal(self)
	if err != nil {
		return fmt.Errorf("peer: encode record: %w", err)
	}
	tmp, err := os.CreateTemp(d.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("peer: discovery dir: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("peer: write record: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("peer: write record: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(d.dir, self.NodeID)); err != nil {
		return fmt.Errorf("peer: write record: %w", err)
	}
	return nil
}

func (d *dirDiscovery) Poll(context.Context) ([]Record, error) {
	entries, err := os.ReadDir(d.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("peer: read discovery dir: %w", err)
	}
	var recs []Record
	var errs []error
	limits := ReadLimits{Max: d.max, Now: d.now()}
	read := 0
	for _, e := range entries {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if read++; read > limits.max() {
			errs = append(errs, fmt.Errorf("peer: %s holds more than %d records; the rest are left out (remove the stale ones)", d.dir, limits.max()))
			break
		}
		data, err := readFileMax(filepath.Join(d.dir, e.Name()), maxRecordSize)
		if errors.Is(err, errRecordTooLarge) {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		if err != nil {
			continue
		}
		r, ok, err := decodeRecord(data, d.maxAge, d.now())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
		}
		if why := limits.future(r.Updated); ok && why != "" {
			errs = append(errs, fmt.Errorf("peer: discovery record %s %s", e.Name(), why))
			ok = false
		}
		if ok {
			recs = append(recs, r)
		}
	}
	return recs, errors.Join(errs...)
}

// errRecordTooLarge is a record file over maxRecordSize.
var errRecordTooLarge = fmt.Errorf("peer: discovery record over %d bytes", maxRecordSize)

// readFileMax reads a file of at most max bytes: anyone who can write
// the shared folder could leave a huge one there.
func readFileMax(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, errRecordTooLarge
	}
	return data, nil
}

// storeDiscovery keeps records under discovery/ in the backup store.
type storeDiscovery struct {
	open   func(ctx context.Context) (BlobStore, error)
	maxAge time.Duration
	now    func() time.Time
	max    int
}

func (d *storeDiscovery) Publish(ctx context.Context, self Record) error {
	s, err := d.open(ctx)
	if err != nil {
		return err
	}
	return PublishToStore(ctx, s, self, d.now())
}

// PublishToStore writes the agent's record to the store's discovery/
// prefix, whatever discovery the agents use: it is also the evidence of
// what the agent saw.
func PublishToStore(ctx context.Context, s BlobStore, self Record, now time.Time) error {
	self = self.bounded()
	self.Updated = now.UTC()
	self.Format = spec.FormatBase
	data, err := json.Marshal(self)
	if err != nil {
		return fmt.Errorf("peer: encode record: %w", err)
	}
	return s.Write(ctx, DiscoveryPrefix+self.NodeID, data)
}

// StoreRecords reads the agents' records from the store, however old,
// within limits; junk is left out, and a record of a newer format, one
// dated in the future or one past the limit is left out with an error
// that says so.
func StoreRecords(ctx context.Context, s BlobStore, limits ReadLimits) ([]Record, error) {
	keys, err := s.List(ctx, DiscoveryPrefix, "")
	if err != nil {
		return nil, err
	}
	var recs []Record
	var errs []error
	sort.Strings(keys) // the same cut every time
	if n := limits.max(); len(keys) > n {
		errs = append(errs, fmt.Errorf("peer: the store holds %d discovery records, more than %d; the rest are left out (remove the stale ones under %s)", len(keys), n, DiscoveryPrefix))
		keys = keys[:n]
	}
	for _, k := range keys {
		data, err := s.ReadMax(ctx, k, maxRecordSize)
		if err != nil {
			// Gone since the listing, or unreadable: the caller tells
			// which from the error.
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		r, ok, err := decodeRecord(data, 0, time.Time{})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
		if why := limits.future(r.Updated); ok && why != "" {
			errs = append(errs, fmt.Errorf("peer: discovery record %s %s", k, why))
			ok = false
		}
		if ok {
			recs = append(recs, r)
		}
	}
	return recs, errors.Join(errs...)
}

func (d *storeDiscovery) Poll(ctx context.Context) ([]Record, error) {
	s, err := d.open(ctx)
	if err != nil {
		return nil, err
	}
	now := d.now()
	recs, err := StoreRecords(ctx, s, ReadLimits{Max: d.max, Now: now})
	fresh := recs[:0]
	for _, r := range recs {
		if d.maxAge <= 0 || r.Updated.IsZero() || now.Sub(r.Updated) <= d.maxAge {
			fresh = append(fresh, r)
		}
	}
	return fresh, err
}

// decodeRecord reads one record; it reports false for junk, a record not
// refreshed within maxAge, or one of a newer format than this agent
// understands (with an error that says so).
func decodeRecord(data []byte, maxAge time.Duration, now time.Time) (Record, bool, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil || r.Address == "" {
		return r, false, nil
	}
	if err := spec.CheckFormat("the discovery record of "+r.NodeID, r.Format); err != nil {
		return r, false, err
	}
	if maxAge > 0 && !r.Updated.IsZero() && now.Sub(r.Updated) > maxAge {
		return r, false, nil
	}
	return r, true, nil
}

// dnsDiscovery resolves a name, as a Kubernetes headless Service publishes
// its pods: SRV records first (with their ports), else A/AAAA records with
// the peer port.
type dnsDiscovery struct {
	name string
	port int
	r    Resolver
}

func (d *dnsDiscovery) Publish(context.Context, Record) error { return nil }

func (d *dnsDiscovery) Poll(ctx context.Context) ([]Record, error) {
	var recs []Record
	if _, srvs, err := d.r.LookupSRV(ctx, "", "", d.name); err == nil && len(srvs) > 0 {
		for _, s := range srvs {
			host := strings.TrimSuffix(s.Target, ".")
			recs = append(recs, Record{Address: net.JoinHostPort(host, strconv.Itoa(int(s.Port)))})
		}
	} else {
		hosts, herr := d.r.LookupHost(ctx, d.name)
		if herr != nil {
			return nil, fmt.Errorf("peer: discovery dns:%s: %w", d.name, herr)
		}
		for _, h := range hosts {
			recs = append(recs, Record{Address: net.JoinHostPort(h, strconv.Itoa(d.port))})
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Address < recs[j].Address })
	return recs, nil
}

// Deleter is the part of the store PruneRecords needs besides reading.
type Deleter interface {
	Delete(ctx context.Context, key string) error
}

// PruneRecords deletes the records of agents not heard from for longer
// than maxAge, and returns their node IDs.
func PruneRecords(ctx context.Context, s interface {
	BlobStore
	Deleter
}, now time.Time, maxAge time.Duration) ([]string, error) {
	recs, err := StoreRecords(ctx, s, ReadLimits{Now: now})
	if err != nil && len(recs) == 0 {
		return nil, err
	}
	var gone []string
	for _, r := range recs {
		if r.NodeID == "" || r.Updated.IsZero() || now.Sub(r.Updated) <= maxAge {
			continue
		}
		if err := s.Delete(ctx, DiscoveryPrefix+r.NodeID); err != nil {
			return gone, err
		}
		gone = append(gone, r.NodeID)
	}
	return gone, nil
}
