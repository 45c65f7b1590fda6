package etcdproc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// MemberStatus is what the local etcd reports about itself.
type MemberStatus struct {
	ClusterID uint64
	MemberID  uint64
	LeaderID  uint64
	Version   string
	DBSize    int64
	IsLearner bool
	RaftIndex uint64
	// Revision is the etcd revision the member has applied.
	Revision int64
	// StorageVersion is the data's schema version (etcd 3.6 and later).
	StorageVersion string
	// DowngradeTarget is the version a cluster downgrade in progress goes
	// to (etcd 3.6 and later), empty when none is.
	DowngradeTarget string
}

// init sets the buffer pool gRPC's clients read messages into (servers
// keep the pool they took when gRPC initialised): gRPC's proto codec
// takes its buffers from the default pool whatever a connection's
// options say. The default pool has no tier between 32 KiB and 1 MiB,
// takes the tier above each message's size and clears all of it: every 32 KiB chunk of a snapshot (its data and a few
// bytes of header) took and cleared 1 MiB, a tenth of the agent's CPU
// time during a backup. Tiers at every power of two up to 1 MiB waste at
// most half of a buffer. gRPC allows this only during initialisation.
func init() {
	p, err := mem.NewBinaryTieredBufferPool(8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20)
	if err != nil {
		panic(fmt.Sprintf("etcdproc: gRPC buffer pool: %v", err)) // fixed tiers: a bug, not input
	}
	experimental.SetDefaultBufferPool(p)
}

// clientWindow is the gRPC flow-control window of the agent's etcd
// clients: how much of etcd's responses may wait in the agent's memory
// before the agent takes them. gRPC's own window grows with its bandwidth
// estimate, up to 16 MiB a connection. Capture's watch, behind a burst of
// writes, gets etcd's messages faster than it spools them: while it
// caught up after an 8 GiB fill (MinIO store), gRPC's pooled buffers held
// 8.9 and 10.2 MiB of the agent's heap at its largest in two runs, and
// 4.2 MiB with this window (an 8 GiB run, docs/benchmarks.md). The rest waits in etcd
// until the agent asks for it. 1 MiB still moves 100 MiB/s at a 10 ms
// round trip; etcd took the fill at about 75 MiB/s on loopback.
const clientWindow = 1 << 20

// NewClient returns an etcd client for endpoints, over TLS when tlsCfg is
// set. The caller closes it.
func NewClient(endpoints []string, tlsCfg *tls.Config) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsCfg,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithInitialWindowSize(clientWindow), grpc.WithInitialConnWindowSize(clientWindow)},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdproc: etcd client for %v: %w", endpoints, err)
	}
	return c, nil
}

// MemberStatusOf asks the etcd at endpoint for its status. clientv3's own
// Status dials the endpoint anew on every call, which with TLS costs a
// handshake on both sides; when c is a client of that endpoint alone,
// it asks over c's connection instead. etcd's client waits for a
// connection until the deadline, and after a failure waits longer and
// longer (up to 2 minutes) before it tries again, while a member that is
// down answers no TCP connection at all: so while the connection is not
// up, a TCP dial says first whether the member listens, and if it does
// the client tries again at once. A call on a connection that was up does
// not wait for one: if the member has just died, it fails at once, and
// goes the same way, instead of waiting to the deadline as etcd's client
// would.
func MemberStatusOf(ctx context.Context, c *clientv3.Client, endpoint string) (*clientv3.StatusResponse, error) {
	if eps := c.Endpoints(); len(eps) != 1 || eps[0] != endpoint {
		return c.Status(ctx, endpoint)
	}
	conn := c.ActiveConnection()
	if conn.GetState() == connectivity.Ready {
		resp, err := statusOver(ctx, conn, false)
		if status.Code(err) != codes.Unavailable {
			return resp, err
		}
	}
	if err := Listening(ctx, endpoint); err != nil {
		return nil, err
	}
	conn.ResetConnectBackoff()
	return statusOver(ctx, conn, true) // the member listens: the connection is on its way
}

func statusOver(ctx context.Context, conn *grpc.ClientConn, wait bool) (*clientv3.StatusResponse, error) {
	resp, err := etcdserverpb.NewMaintenanceClient(conn).Status(ctx, &etcdserverpb.StatusRequest{}, grpc.WaitForReady(wait))
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.StatusResponse)(resp), nil
}

// LocalStatus asks the etcd at endpoint for its status. It succeeds only if
// that member answers; it does not need quorum, but etcd answers clients
// only once it has joined its cluster since it started (see PeerMembers).
func LocalStatus(ctx context.Context, c *clientv3.Client, endpoint string) (MemberStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := MemberStatusOf(ctx, c, endpoint)
	if err != nil {
		return MemberStatus{}, fmt.Errorf("etcdproc: status of %s: %w", endpoint, err)
	}
	return MemberStatus{
		ClusterID:      st.Header.ClusterId,
		MemberID:       st.Header.MemberId,
		Revision:       st.Header.Revision,
		LeaderID:       st.Leader,
		Version:        st.Version,
		DBSize:         st.DbSize,
		IsLearner:      st.IsLearner,
		RaftIndex:      st.RaftIndex,
		StorageVersion: st.StorageVersion,
		DowngradeTarget: func() string {
			if d := st.DowngradeInfo; d != nil && d.Enabled {
				return d.TargetVersion
			}
			return ""
		}(),
	}, nil
}

// NewHTTPClient returns an HTTP client for etcd's HTTP endpoints (such as
// /version), over TLS when tlsCfg is set. Callers keep one and reuse it.
func NewHTTPClient(tlsCfg *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tlsCfg
	t.MaxIdleConnsPerHost = 2
	return &http.Client{Transport: t, Timeout: 5 * time.Second}
}

// ClusterVersion reads the cluster version (etcd's "etcdcluster") from
// the /version endpoint of the etcd at clientURL.
func ClusterVersion(ctx context.Context, client *http.Client, clientURL string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(clientURL, "/")+"/version", nil)
	if err != nil {
		return "", fmt.Errorf("etcdproc: cluster version: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("etcdproc: cluster version from %s: %w", clientURL, err)
	}
	defer resp.Body.Close()
	var v struct {
		Cluster string `json:"etcdcluster"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&v); err != nil {
		return "", fmt.Errorf("etcdproc: cluster version from %s: %w", clientURL, err)
	}
	return v.Cluster, nil
}

// NewPeerHTTPClient returns an HTTP client for etcd's peer port, over TLS
// when tlsCfg is set. The peer port speaks HTTP/1.1 to anything but
// raft's own streams, so HTTP/2 is never attempted.
func NewPeerHTTPClient(tlsCfg *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if tlsCfg != nil {
		t.TLSClientConfig = tlsCfg.Clone()
		t.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	t.MaxIdleConnsPerHost = 1
	return &http.Client{Transport: t, Timeout: 5 * time.Second}
}

// PeerMember is a member as etcd's peer port lists it.
type PeerMember struct {
	ID        uint64   `json:"id"`
	Name      string   `json:"name"`
	PeerURLs  []string `json:"peerURLs"`
	IsLearner bool     `json:"isLearner"`
}

// maxPeerMembersBytes bounds the member list read from a peer port: far
// above any real cluster's.
const maxPeerMembersBytes = 1 << 20

// PeerMembers lists the members the etcd at peerURL knows, from its own
// copy of the membership, through its peer port. That answers even when
// etcd serves no client: a member restarted while its cluster has no
// quorum never does (etcd serves clients only once it has published
// itself through raft, which needs a leader).
func PeerMembers(ctx context.Context, client *http.Client, peerURL string) ([]PeerMember, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(peerURL, "/")+"/members", nil)
	if err != nil {
		return nil, fmt.Errorf("etcdproc: members from %s: %w", peerURL, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("etcdproc: members from %s: %w", peerURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("etcdproc: members from %s: %s", peerURL, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPeerMembersBytes+1))
	if err != nil {
		return nil, fmt.Errorf("etcdproc: members from %s: %w", peerURL, err)
	}
	if len(data) > maxPeerMembersBytes {
		return nil, fmt.Errorf("etcdproc: members from %s: the list is over %d bytes", peerURL, maxPeerMembersBytes)
	}
	var ms []PeerMember
	if err := json.Unmarshal(data, &ms); err != nil {
		return nil, fmt.Errorf("etcdproc: members from %s: %w", peerURL, err)
	}
	return ms, nil
}

// listenTimeout bounds Listening's connection attempt.
const listenTimeout = time.Second

// Listening reports whether something accepts TCP connections at the
// host and port of url, an etcd client or peer URL. Refused, it fails at
// once: etcd's client would wait for a connection until its deadline.
func Listening(ctx context.Context, url string) error {
	u, err := neturl.Parse(url)
	if err != nil || u.Host == "" {
		return fmt.Errorf("etcdproc: URL %q names no host", url)
	}
	ctx, cancel := context.WithTimeout(ctx, listenTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Errorf("etcdproc: nothing listens at %s: %w", u.Host, err)
	}
	return conn.Close()
}
