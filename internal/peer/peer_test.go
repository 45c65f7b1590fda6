package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// recorder is a Handler that records calls.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(s string) { r.mu.Lock(); r.calls = append(r.calls, s); r.mu.Unlock() }
func (r *recorder) Info(context.Context) (NodeInfo, error) {
	r.add("Info()")
	return NodeInfo{NodeID: "n1", ClusterName: "main", Member: &etcdproc.MemberState{ClusterToken: "tok"}, EtcdHealthy: true}, nil
}
func (r *recorder) Join(_ context.Context, req JoinRequest) error {
	r.add("Join(" + req.LeaderID + "," + req.Member.ClusterToken + ")")
	if req.Member.ClusterToken == "busy" {
		return ErrBusy
	}
	return nil
}
func (r *recorder) Leave(_ context.Context, req LeaveRequest) error {
	r.add("Leave(" + req.Token + "," + req.Reason + ")")
	return nil
}

func (r *recorder) Restore(_ context.Context, req RestoreRequest) error {
	r.add("Restore(" + req.Backup + "," + req.Member.ClusterToken + ")")
	return nil
}
func (r *recorder) Quarantine(_ context.Context, req QuarantineRequest) error {
	r.add(fmt.Sprintf("Quarantine(%s,%v)", req.Token, req.Quarantined))
	return nil
}

func (r *recorder) Recover(_ context.Context, req RecoverRequest) error {
	r.add("Recover(" + req.Token + ")")
	return nil
}

func (r *recorder) SetPeerURLs(_ context.Context, req PeerURLsRequest) error {
	r.add("SetPeerURLs(" + req.Token + ")")
	return nil
}
func (r *recorder) SetPeerCertCheck(_ context.Context, req PeerCertCheckRequest) error {
	r.add("SetPeerCertCheck(" + req.Token + "," + req.Hostname + ")")
	return nil
}
func (r *recorder) SyncCA(_ context.Context, req CARequest) error {
	r.add("SyncCA(" + req.Token + "," + req.Issuer + ")")
	return nil
}
func (r *recorder) Fence(_ context.Context, req FenceRequest) error {
	r.add(fmt.Sprintf("Fence(%d)", req.Term))
	return nil
}

func (r *recorder) SetSettings(_ context.Context, req SettingsRequest) error {
	r.add("SetSettings(" + req.Token + "," + req.Settings["snapshot-count"] + ")")
	return nil
}

func (r *recorder) DiscardData(_ context.Context, req DiscardRequest) error {
	r.add(fmt.Sprintf("DiscardData(%s,%x)", req.Token, req.MemberID))
	return nil
}
func (r *recorder) HashData(_ context.Context, req HashDataRequest) (DataHash, error) {
	r.add(fmt.Sprintf("HashData(%s,%d)", req.Token, req.Revision))
	return DataHash{Hash: 7, Revision: req.Revision}, nil
}
func (r *recorder) Resume(_ context.Context, req ResumeRequest) error {
	r.add(fmt.Sprintf("Resume(%s,%x)", req.Token, req.MemberID))
	return nil
}

func (r *recorder) Defrag(_ context.Context, req DefragRequest) (DefragResult, error) {
	r.add(fmt.Sprintf("Defrag(%s,%x,%d)", req.Token, req.MemberID, req.InUseBytes))
	return DefragResult{SizeBefore: 300, SizeAfter: 100, Took: time.Second}, nil
}

func (r *recorder) SetVersion(_ context.Context, req VersionRequest) error {
	r.add("SetVersion(" + req.Token + "," + req.Version + ")")
	return nil
}

// servePeerAPI serves the peer API of cluster "main" on loopback with
// rec as the handler, set up further by setup, and returns a client of it
// and its address.
func servePeerAPI(t *testing.T, rec *recorder, setup ...func(*Server)) (*Client, string) {
	t.Helper()
	creds := InsecureCredentials()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(creds, "main", rec)
	for _, f := range setup {
		f(srv)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	c, err := Dial(l.Addr().String(), "main", creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, l.Addr().String()
}

func TestPeerAPIOverLoopback(t *testing.T) {
	rec := &recorder{}
	c, addr := servePeerAPI(t, rec)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NodeID != "n1" || info.Member == nil || info.Member.ClusterToken != "tok" || !info.EtcdHealthy {
		t.Errorf("info = %+v", info)
	}
	if err := c.Join(ctx, JoinRequest{LeaderID: "L", Member: etcdproc.MemberState{ClusterToken: "tok"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Join(ctx, JoinRequest{LeaderID: "L", Member: etcdproc.MemberState{ClusterToken: "busy"}}); err == nil || !strings.Contains(err.Error(), "another cluster") {
		t.Errorf("busy join: %v", err)
	}
	if err := c.Leave(ctx, LeaveRequest{Token: "tok", Reason: "why"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(ctx, RestoreRequest{Backup: "b1", Member: etcdproc.MemberState{ClusterToken: "new"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Quarantine(ctx, QuarantineRequest{Token: "new", Quarantined: false}); err != nil {
		t.Fatal(err)
	}
	if err := c.Recover(ctx, RecoverRequest{Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetSettings(ctx, SettingsRequest{Token: "tok", Settings: map[string]string{"snapshot-count": "5"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.DiscardData(ctx, DiscardRequest{Token: "tok", MemberID: 0xab}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Defrag(ctx, DefragRequest{Token: "tok", MemberID: 0xab, InUseBytes: 100}); err != nil {
		t.Fatal(err)
	} else if res != (DefragResult{SizeBefore: 300, SizeAfter: 100, Took: time.Second}) {
		t.Errorf("Defrag = %+v", res)
	}
	if err := c.SetVersion(ctx, VersionRequest{Token: "tok", Version: "3.7.3"}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPeerCertCheck(ctx, PeerCertCheckRequest{Token: "tok", Hostname: "node.main.etcd-manager.internal"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Fence(ctx, FenceRequest{Term: 9}); err != nil {
		t.Fatal(err)
	}
	want := "Info() Join(L,tok) Join(L,busy) Leave(tok,why) Restore(b1,new) Quarantine(new,false) Recover(tok) SetSettings(tok,5) DiscardData(tok,ab) Defrag(tok,ab,100) SetVersion(tok,3.7.3) SetPeerCertCheck(tok,node.main.etcd-manager.internal) Fence(9)"
	if got := strings.Join(rec.calls, " "); got != want {
		t.Errorf("calls = %q, want %q", got, want)
	}

	// An agent of another cluster is refused before the handler runs.
	other, _ := Dial(addr, "events", InsecureCredentials())
	defer other.Close()
	if _, err := other.Info(ctx); err == nil || !strings.Contains(err.Error(), "another cluster") {
		t.Errorf("cross-cluster info: %v", err)
	}
	if len(rec.calls) != 13 {
		t.Errorf("handler ran for another cluster: %v", rec.calls)
	}
}

// Every call that names a cluster token is refused, InvalidArgument,
// before the handler runs when the token could leave the node's data
// folders.
func TestPeerAPIRefusesHostileTokens(t *testing.T) {
	rec := &recorder{}
	c, _ := servePeerAPI(t, rec)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for _, bad := range []string{"../../../victim", "", "a/b", "\x1b[2J"} {
		member := etcdproc.MemberState{ClusterToken: bad}
		for name, call := range map[string]func() error{
			"Join":        func() error { return c.Join(ctx, JoinRequest{Member: member}) },
			"Leave":       func() error { return c.Leave(ctx, LeaveRequest{Token: bad}) },
			"Restore":     func() error { return c.Restore(ctx, RestoreRequest{Backup: "b", Member: member}) },
			"Quarantine":  func() error { return c.Quarantine(ctx, QuarantineRequest{Token: bad}) },
			"Recover":     func() error { return c.Recover(ctx, RecoverRequest{Token: bad}) },
			"SetVersion":  func() error { return c.SetVersion(ctx, VersionRequest{Token: bad}) },
			"SetSettings": func() error { return c.SetSettings(ctx, SettingsRequest{Token: bad}) },
			"DiscardData": func() error { return c.DiscardData(ctx, DiscardRequest{Token: bad}) },
			"Defrag": func() error {
				_, err := c.Defrag(ctx, DefragRequest{Token: bad})
				return err
			},
			"SetPeerURLs": func() error { return c.SetPeerURLs(ctx, PeerURLsRequest{Token: bad}) },
		} {
			err := call()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is not a cluster token") {
				t.Errorf("%s with token %q: %v, want InvalidArgument", name, bad, err)
			}
		}
	}
	if len(rec.calls) != 0 {
		t.Errorf("the handler ran: %v", rec.calls)
	}
}

type memStore struct {
	mu   sync.Mutex
	objs map[string][]byte
}

func (m *memStore) Write(_ context.Context, k string, d []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objs[k] = d
	return nil
}
func (m *memStore) ReadMax(ctx context.Context, k string, _ int64) ([]byte, error) {
	return m.Read(ctx, k)
}

func (m *memStore) Read(_ context.Context, k string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.objs[k]
	if !ok {
		return nil, errors.New("not found")
	}
	return d, nil
}
func (m *memStore) List(_ context.Context, prefix, _ string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out, nil
}

func addrs(recs []Record) string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Address)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestPublishingProviders(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := &memStore{objs: map[string][]byte{}}
	dir := filepath.Join(t.TempDir(), "discovery")
	providers := map[string]string{"store": "store", "dir": "file://" + dir}
	for name, specStr := range providers {
		t.Run(name, func(t *testing.T) {
			d, err := ParseDiscovery(specStr, DiscoveryOptions{
				Store:  func(context.Context) (BlobStore, error) { return mem, nil },
				MaxAge: time.Hour, Now: clock,
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, addr := range []string{"127.0.0.1:8000", "127.0.0.2:8000", "127.0.0.3:8000"} {
				if err := d.Publish(t.Context(), Record{NodeID: string(rune('a' + i)), ClusterName: "main", Address: addr}); err != nil {
					t.Fatal(err)
				}
			}
			// Re-publishing replaces a node's record.
			if err := d.Publish(t.Context(), Record{NodeID: "c", ClusterName: "main", Address: "127.0.0.3:9000"}); err != nil {
				t.Fatal(err)
			}
			recs, err := d.Poll(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got := addrs(recs); got != "127.0.0.1:8000,127.0.0.2:8000,127.0.0.3:9000" {
				t.Errorf("poll = %s", got)
			}
		})
	}
	// Stale records are dropped.
	d, _ := ParseDiscovery("file://"+dir, DiscoveryOptions{MaxAge: time.Minute, Now: func() time.Time { return now.Add(time.Hour) }})
	if recs, _ := d.Poll(t.Context()); len(recs) != 0 {
		t.Errorf("stale records kept: %v", recs)
	}
	// Junk files in the directory are skipped.
	if err := os.WriteFile(filepath.Join(dir, "junk"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, _ = ParseDiscovery("file://"+dir, DiscoveryOptions{Now: clock})
	if recs, err := d.Poll(t.Context()); err != nil || len(recs) != 3 {
		t.Errorf("poll with junk: %v, %v", recs, err)
	}
	// A record of a newer format is left out, and the poll says why.
	if err := os.WriteFile(filepath.Join(dir, "z"), []byte(`{"format":9,"nodeId":"z","address":"127.0.0.9:8000"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := d.Poll(t.Context())
	if len(recs) != 3 || !errors.Is(err, spec.ErrNewerFormat) {
		t.Errorf("poll with a newer record: %v, %v; want 3 records and ErrNewerFormat", addrs(recs), err)
	}
	// A huge file in the shared folder is read only up to the bound, and
	// named; the other records still count.
	if err := os.Remove(filepath.Join(dir, "z")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "huge"), bytes.Repeat([]byte(" "), 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err = d.Poll(t.Context())
	if len(recs) != 3 || !errors.Is(err, errRecordTooLarge) || !strings.Contains(err.Error(), "huge") {
		t.Errorf("poll with a huge file: %v, %v; want 3 records and the file named", addrs(recs), err)
	}
}

func TestStaticDiscovery(t *testing.T) {
	d, err := ParseDiscovery("static:127.0.0.1:8000, 127.0.0.2:8000,", DiscoveryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := d.Poll(t.Context())
	if got := addrs(recs); got != "127.0.0.1:8000,127.0.0.2:8000" {
		t.Errorf("poll = %s", got)
	}
}

type stubResolver struct {
	srv   []*net.SRV
	hosts []string
	err   error
	calls []string
}

func (s *stubResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	s.calls = append(s.calls, "SRV("+name+")")
	if len(s.srv) == 0 {
		return "", nil, errors.New("no SRV")
	}
	return name, s.srv, nil
}
func (s *stubResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	s.calls = append(s.calls, "Host("+host+")")
	return s.hosts, s.err
}

func TestDNSDiscovery(t *testing.T) {
	tests := []struct {
		name      string
		r         *stubResolver
		want      string
		wantCalls string
		wantErr   bool
	}{
		{name: "srv records", r: &stubResolver{srv: []*net.SRV{{Target: "etcd-1.etcd.ns.svc.", Port: 8000}, {Target: "etcd-0.etcd.ns.svc.", Port: 8000}}},
			want: "etcd-0.etcd.ns.svc:8000,etcd-1.etcd.ns.svc:8000", wantCalls: "SRV(etcd.ns.svc)"},
		{name: "a records with the peer port", r: &stubResolver{hosts: []string{"10.0.0.2", "10.0.0.1"}},
			want: "10.0.0.1:8123,10.0.0.2:8123", wantCalls: "SRV(etcd.ns.svc) Host(etcd.ns.svc)"},
		{name: "lookup failure", r: &stubResolver{err: errors.New("nxdomain")}, wantErr: true, wantCalls: "SRV(etcd.ns.svc) Host(etcd.ns.svc)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseDiscovery("dns:etcd.ns.svc", DiscoveryOptions{Resolver: tt.r, PeerPort: 8123})
			if err != nil {
				t.Fatal(err)
			}
			recs, err := d.Poll(t.Context())
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !tt.wantErr && addrs(recs) != tt.want {
				t.Errorf("poll = %s, want %s", addrs(recs), tt.want)
			}
			if got := strings.Join(tt.r.calls, " "); got != tt.wantCalls {
				t.Errorf("calls = %q, want %q", got, tt.wantCalls)
			}
		})
	}
}

func TestParseDiscoveryErrors(t *testing.T) {
	for _, s := range []string{"file://relative", "static:", "static:nohostport", "static:tcp://127.0.0.1:8000", "static::8000", "dns:", "consul:x", "store"} {
		if _, err := ParseDiscovery(s, DiscoveryOptions{}); !errors.Is(err, ErrBadDiscovery) {
			t.Errorf("ParseDiscovery(%q) = %v, want ErrBadDiscovery", s, err)
		}
	}
}

func (m *memStore) Delete(_ context.Context, k string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, k)
	return nil
}

// Records of agents not heard from for longer than the bound are removed;
// the others, and what each reported, are kept.
func TestStoreRecordsAndPrune(t *testing.T) {
	mem := &memStore{objs: map[string][]byte{}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, age := range []time.Duration{time.Minute, 48 * time.Hour} {
		rec := Record{NodeID: string(rune('a' + i)), Address: "127.0.0.1:8000", Etcd: &EtcdReport{ClusterToken: "tok", HasData: true, RaftLeader: 7}}
		if err := PublishToStore(t.Context(), mem, rec, t0.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := StoreRecords(t.Context(), mem, ReadLimits{})
	if err != nil || len(recs) != 2 || recs[0].Etcd == nil || recs[0].Etcd.RaftLeader != 7 {
		t.Fatalf("records: %+v, %v", recs, err)
	}
	gone, err := PruneRecords(t.Context(), mem, t0, 24*time.Hour)
	if err != nil || len(gone) != 1 || gone[0] != "b" {
		t.Fatalf("pruned %v, %v; want b", gone, err)
	}
	if recs, _ := StoreRecords(t.Context(), mem, ReadLimits{}); len(recs) != 1 || recs[0].NodeID != "a" {
		t.Errorf("left: %+v", recs)
	}
}

// A record carries its node's installed etcd versions, the newest
// MaxReportedVersions of them, through either publishing provider; a
// record without them (an older agent's) has no such field at all.
func TestRecordEtcdVersions(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mem := &memStore{objs: map[string][]byte{}}
	many := make([]string, 0, 100)
	for i := range 100 {
		many = append(many, fmt.Sprintf("3.%d.%d", 4+i/50, i%50))
	}
	for name, specStr := range map[string]string{"store": "store", "dir": "file://" + filepath.Join(t.TempDir(), "discovery")} {
		t.Run(name, func(t *testing.T) {
			d, err := ParseDiscovery(specStr, DiscoveryOptions{Store: func(context.Context) (BlobStore, error) { return mem, nil }, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range []Record{
				{NodeID: "a", Address: "127.0.0.1:8000", EtcdVersions: []string{"3.5.35", "3.6.16"}},
				{NodeID: "b", Address: "127.0.0.2:8000", EtcdVersions: many},
				{NodeID: "c", Address: "127.0.0.3:8000"},
			} {
				if err := d.Publish(t.Context(), r); err != nil {
					t.Fatal(err)
				}
			}
			recs, err := d.Poll(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for _, r := range recs {
				got[r.NodeID] = r.EtcdVersions
			}
			if !slices.Equal(got["a"], []string{"3.5.35", "3.6.16"}) {
				t.Errorf("a reported %v", got["a"])
			}
			if len(got["b"]) != MaxReportedVersions || got["b"][MaxReportedVersions-1] != "3.5.49" || got["b"][0] != many[100-MaxReportedVersions] {
				t.Errorf("b reported %d versions, %v; want the newest %d", len(got["b"]), got["b"], MaxReportedVersions)
			}
			if got["c"] != nil {
				t.Errorf("c reported %v", got["c"])
			}
		})
	}
	// The largest record stays far below what readers accept.
	data, err := json.Marshal(Record{NodeID: strings.Repeat("n", 63), ClusterName: strings.Repeat("c", 63), Address: "[2001:db8::1]:8000",
		Etcd: &EtcdReport{ClusterToken: strings.Repeat("t", 64)}, EtcdVersions: many}.bounded())
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > maxRecordSize/4 {
		t.Errorf("a record with %d versions is %d bytes; readers refuse one over %d", MaxReportedVersions, len(data), maxRecordSize)
	}
	// Backward compatible: no field without versions, and an older
	// agent's record reads with none.
	data, _ = json.Marshal(Record{NodeID: "c", Address: "127.0.0.3:8000"})
	if strings.Contains(string(data), "etcdVersions") {
		t.Errorf("a record without versions encodes as %s", data)
	}
	r, ok, err := decodeRecord([]byte(`{"nodeId":"old","address":"127.0.0.4:8000","updated":"2026-01-01T00:00:00Z"}`), 0, now)
	if !ok || err != nil || r.EtcdVersions != nil {
		t.Errorf("an older agent's record: %+v, %v, %v", r, ok, err)
	}
}

func TestRecordHasEtcd(t *testing.T) {
	full := make([]string, 0, MaxReportedVersions)
	for i := range MaxReportedVersions {
		full = append(full, fmt.Sprintf("3.5.%d", i+10))
	}
	tests := []struct {
		name            string
		versions        []string
		v               string
		wantHas, wantOK bool
	}{
		{name: "installed", versions: []string{"3.5.35", "3.6.16"}, v: "3.6.16", wantHas: true, wantOK: true},
		{name: "missing", versions: []string{"3.5.35", "3.6.16"}, v: "3.7.3", wantOK: true},
		{name: "missing and older than all", versions: []string{"3.5.35", "3.6.16"}, v: "3.4.23", wantOK: true},
		{name: "an older agent reports nothing", v: "3.6.16"},
		{name: "junk only", versions: []string{"latest", "\x1b[2J"}, v: "3.6.16"},
		{name: "junk beside a version", versions: []string{"latest", "3.6.16"}, v: "3.6.16", wantHas: true, wantOK: true},
		{name: "older than a list cut short", versions: full, v: "3.4.23"},
		{name: "newer than a list cut short", versions: full, v: "3.7.3", wantOK: true},
		{name: "in a list cut short", versions: full, v: "3.5.20", wantHas: true, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := spec.ParseVersion(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			has, ok := Record{EtcdVersions: tt.versions}.HasEtcd(v)
			if has != tt.wantHas || ok != tt.wantOK {
				t.Errorf("HasEtcd(%s) = %t, %t; want %t, %t", tt.v, has, ok, tt.wantHas, tt.wantOK)
			}
		})
	}
}

// Announce tells the peer's agent that the caller changed; Info does not.
func TestAnnounceTellsThePeer(t *testing.T) {
	var told atomic.Int32
	var from atomic.Value
	c, _ := servePeerAPI(t, &recorder{}, func(s *Server) {
		s.OnPeerChange(func(host string) { told.Add(1); from.Store(host) })
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if n := told.Load(); n != 0 {
		t.Fatalf("Info told the peer of a change %d time(s)", n)
	}
	info, err := c.Announce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NodeID != "n1" {
		t.Errorf("Announce answered %+v", info)
	}
	if n := told.Load(); n != 1 {
		t.Fatalf("Announce told the peer of a change %d time(s), want 1", n)
	}
	if h := from.Load(); h != "127.0.0.1" {
		t.Errorf("the announcement came from host %q, want 127.0.0.1", h)
	}
}

// Planted records are bounded: of 20,000, at most the limit are read, the
// cut is reported, and a record dated a century ahead (fresh forever, by
// age) is left out and reported.
func TestStoreRecordsBounded(t *testing.T) {
	mem := &memStore{objs: map[string][]byte{}}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	rec := func(id string, at time.Time) []byte {
		data, _ := json.Marshal(Record{Format: spec.FormatBase, NodeID: id, Address: "127.0.0.1:8000", Updated: at})
		return data
	}
	mem.objs[DiscoveryPrefix+"a-future"] = rec("a-future", now.AddDate(100, 0, 0))
	mem.objs[DiscoveryPrefix+"a-real"] = rec("a-real", now)
	for i := range 20000 {
		id := fmt.Sprintf("planted-%05d", i)
		mem.objs[DiscoveryPrefix+id] = rec(id, now)
	}
	recs, err := StoreRecords(t.Context(), mem, ReadLimits{Now: now})
	if len(recs) > DefaultMaxRecords {
		t.Errorf("%d records read, want at most %d", len(recs), DefaultMaxRecords)
	}
	for _, r := range recs {
		if r.NodeID == "a-future" {
			t.Error("a record dated a century ahead was read")
		}
	}
	if err == nil || !strings.Contains(err.Error(), "more than 1000") || !strings.Contains(err.Error(), "after this agent's clock") {
		t.Errorf("the cut and the future record are not reported: %v", err)
	}
	// Through the provider, as the agents poll it.
	d, err := ParseDiscovery("store", DiscoveryOptions{Store: func(context.Context) (BlobStore, error) { return mem, nil }, Now: func() time.Time { return now }, MaxRecords: 50})
	if err != nil {
		t.Fatal(err)
	}
	if polled, _ := d.Poll(t.Context()); len(polled) > 50 {
		t.Errorf("the provider returned %d records, want at most 50", len(polled))
	}
}

// The server bounds its connections, and closes one that never finishes
// its handshake: a peer that opens connections without end, or holds
// them silent, is cut off, and real calls get through again.
func TestServerLimits(t *testing.T) {
	rec := &recorder{}
	c, addr := servePeerAPI(t, rec)
	var silent []net.Conn
	t.Cleanup(func() {
		for _, s := range silent {
			s.Close()
		}
	})
	for range MaxConnections {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, conn)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, err := c.Info(ctx)
	cancel()
	if err == nil {
		t.Fatalf("a call went through with %d silent connections open", MaxConnections)
	}
	// The silent connections are closed once their handshake is overdue.
	_ = silent[0].SetReadDeadline(time.Now().Add(HandshakeTimeout + 10*time.Second))
	if _, err := io.Copy(io.Discard, silent[0]); err != nil { // the server's settings, then its close
		t.Fatalf("a silent connection was not closed within its handshake timeout: %v", err)
	}
	if took := time.Since(start); took > HandshakeTimeout+10*time.Second {
		t.Errorf("closed after %s", took)
	}
	// The client's connection attempt made while the server was full may
	// be the one torn down: a call is retried for a few seconds.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
		_, err = c.Info(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a call after the silent connections were closed: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
