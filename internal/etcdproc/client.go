package etcdproc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
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
	// StorageVersion is the data's schema version (etcd 3.6 and later).
	StorageVersion string
	// DowngradeTarget is the version a cluster downgrade in progress goes
	// to (etcd 3.6 and later), empty when none is.
	DowngradeTarget string
}

// NewClient returns an etcd client for endpoints, over TLS when tlsCfg is
// set. The caller closes it.
func NewClient(endpoints []string, tlsCfg *tls.Config) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsCfg,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcdproc: etcd client for %v: %w", endpoints, err)
	}
	return c, nil
}

// LocalStatus asks the etcd at endpoint for its status. It succeeds only if
// that member answers; it does not need quorum.
func LocalStatus(ctx context.Context, c *clientv3.Client, endpoint string) (MemberStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := c.Status(ctx, endpoint)
	if err != nil {
		return MemberStatus{}, fmt.Errorf("etcdproc: status of %s: %w", endpoint, err)
	}
	return MemberStatus{
		ClusterID:      st.Header.ClusterId,
		MemberID:       st.Header.MemberId,
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
