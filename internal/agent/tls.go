package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The agent's certificates. Unless both --insecure and --etcd-insecure are
// given, the agent holds a node certificate from the cluster's CA under
// <data-dir>/pki: the peer API serves and dials with it (mutual TLS), and
// etcd serves clients and peers with it, requiring certificates from the
// same CA. A goroutine renews it two thirds into its life; everything
// that uses it reads the files again, so no restart is needed.

// pkiFiles are this node's certificate files.
func (a *Agent) pkiFiles() pki.NodeFiles {
	return pki.NodeFiles{Dir: filepath.Join(a.cfg.DataDir, "pki")}
}

func (a *Agent) tlsEnabled() bool { return !a.cfg.Insecure || !a.cfg.EtcdInsecure }

// loadTrust reads the CA from --pki-dir, or from the store, creating it
// there on first use, with the CAs to trust (more than the CA while a
// rotation runs). Either refuses a CA that is not valid now.
func (a *Agent) loadTrust(ctx context.Context) (pki.StoreTrust, error) {
	if a.cfg.PKIDir != "" {
		ca, err := pki.LoadCADir(a.cfg.PKIDir, a.now())
		if err != nil {
			return pki.StoreTrust{}, err
		}
		return pki.StoreTrust{CA: ca, Trust: ca.CertPEM}, nil
	}
	// A store of its own: the renewal goroutine must not share the
	// loop's.
	s, err := store.Open(ctx, a.cfg.BackupStore, store.Options{Create: true})
	if err != nil {
		return pki.StoreTrust{}, err
	}
	defer s.Close()
	ca, created, err := pki.EnsureStoreCA(ctx, s, isNotFound, isExists, a.now())
	if err != nil {
		return pki.StoreTrust{}, err
	}
	if created {
		a.log.Warn("generated the cluster's CA and stored it in the backup store; its pki/ prefix holds the CA key, so guard it",
			"key", pki.StoreCAKey, "expires", ca.Cert.NotAfter)
		return pki.StoreTrust{CA: ca, Trust: ca.CertPEM}, nil
	}
	return pki.LoadStoreTrust(ctx, s, isNotFound, a.now())
}

// caOutOfDate reports whether err is about a CA that is not valid now.
func caOutOfDate(err error) bool {
	return errors.Is(err, pki.ErrCAExpired) || errors.Is(err, pki.ErrCANotYetValid)
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
func isExists(err error) bool   { return errors.Is(err, store.ErrExists) }

// certRequest is this node's certificate: every address and name its
// peer API and etcd are reached by.
func (a *Agent) certRequest() pki.CertRequest {
	var dns []string
	var ips []net.IP
	add := func(host string) {
		if host == "" {
			return
		}
		if ip := net.ParseIP(host); ip != nil {
			// A wildcard bind address (0.0.0.0) names no one.
			if !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		} else if !slices.Contains(dns, host) {
			dns = append(dns, host)
		}
	}
	add(a.cfg.Address)
	add(a.cfg.EtcdAddress)
	for _, list := range [][]string{a.cfg.ClientURLs, a.cfg.QuarantineClientURLs, a.cfg.PeerURLs, a.cfg.ListenPeerURLs} {
		for _, raw := range list {
			if u, err := url.Parse(raw); err == nil {
				add(u.Hostname())
			}
		}
	}
	for _, n := range a.cfg.CertNames {
		add(n)
	}
	add("localhost")
	add("127.0.0.1")
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	// The name etcd's peer port requires of node certificates once every
	// member's carries it; an older certificate without it is reissued at
	// start, as for any change of names.
	add(a.nodeMarker())
	// The store's, which binds the certificate to this cluster rather
	// than to any of its name on the same CA; an older certificate
	// without it is reissued at start.
	add(a.storeMarker())
	return pki.CertRequest{CommonName: a.nodeID, Role: pki.RoleNode, DNSNames: dns, IPs: ips, Validity: a.cfg.CertValidity}
}

// nodeMarker is the name only this cluster's node certificates carry.
func (a *Agent) nodeMarker() string { return pki.NodeMarker(a.cfg.ClusterName) }

// storeMarker is the name the node certificates of the clusters that
// keep their state in this agent's store carry; "" for a store URL that
// does not parse (Validate refuses it first).
func (a *Agent) storeMarker() string {
	id, err := store.Identity(a.cfg.BackupStore)
	if err != nil {
		return ""
	}
	return pki.StoreMarker(id)
}

// certMarker is the node marker for the leader to require of etcd's
// peers, as this node reports it: empty while etcd runs without TLS, or
// its certificate lacks the marker.
func (a *Agent) certMarker() string {
	if a.cfg.EtcdInsecure || !a.certMarked.Load() {
		return ""
	}
	return a.nodeMarker()
}

// setupTLS makes sure the node has a current certificate before the peer
// API and etcd start, and sets up the credentials that use it. It warns
// first when --insecure or --etcd-insecure turns TLS off. Without
// the CA (the store unreachable, say), a certificate already on disk
// still serves, and is renewed once the CA can be read; with none on
// disk, it waits and retries, logging why.
func (a *Agent) setupTLS(ctx context.Context) error {
	if attrs := a.cfg.securityOff(); attrs != nil {
		a.log.Warn(msgTLSOff, attrs...)
	}
	if !a.tlsEnabled() {
		a.serverCreds, a.creds = insecure.NewCredentials(), insecure.NewCredentials()
		return nil
	}
	files := a.pkiFiles()
	delay := time.Second
	for {
		err := a.renewCert(ctx)
		if err == nil {
			break
		}
		if a.cfg.PKIDir != "" && caOutOfDate(err) {
			// Files stay out of date until someone replaces them:
			// refuse to start, with the dates, rather than retry.
			return fmt.Errorf("agent: %w", err)
		}
		if c, ok := a.certOnDisk(); ok {
			a.log.Warn("cannot renew the node certificate now; using the one on disk", "error", err, "expires", c.NotAfter)
			a.certMarked.Store(pki.CarriesName(c, a.nodeMarker()))
			break
		}
		a.log.Error("cannot issue the node certificate; retrying", "error", err, "retry-in", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
	// Read at each handshake, so that a CA rotation needs no restart.
	trust := pki.TrustFile(files.CA())
	if _, err := trust.Pool(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if a.cfg.Insecure {
		a.serverCreds, a.creds = insecure.NewCredentials(), insecure.NewCredentials()
	} else {
		a.refusals = newRefusalLog(refusalLogInterval, refusalLogMaxKeys, a.now)
		a.serverCreds = credentials.NewTLS(pki.ServerConfig(files, trust, a.logRefusal))
		a.creds = credentials.NewTLS(pki.WithRevocations(pki.NodeClientConfig(files, trust, a.nodeMarker()), &a.revoked))
	}
	if !a.cfg.EtcdInsecure {
		a.etcdTLS = pki.WithRevocations(pki.ClientConfig(files, trust, a.nodeMarker()), &a.revoked)
		if !a.cfg.EtcdPeerCertCheck {
			a.log.Warn("etcd's peer port is to accept any certificate from the CA, an operator's too: --etcd-peer-cert-check=false turns the node certificate check off for the whole cluster",
				"risk", "whoever holds a client certificate from the CA (issue-client-cert) can send raft traffic to etcd",
				"fix", "drop --etcd-peer-cert-check=false once every agent runs this etcd-manager or later")
		}
	}
	return nil
}

// logRefusal logs a refused peer API handshake, as a.refusals allows:
// the first of each client host and reason, then at most one a minute
// with the count left out.
func (a *Agent) logRefusal(remote net.Addr, err error) {
	host := remoteHost(remote)
	log, suppressed, pooled := a.refusals.allow(host, err.Error())
	if !log {
		return
	}
	attrs := []any{"remote", host, "error", err, "suppressed", suppressed, "suppressed-within", a.refusals.interval}
	if pooled {
		attrs = append(attrs, "pooled", "refusals from too many hosts at once; those past the first are counted together")
	}
	a.log.Warn("peer API refused a connection", attrs...)
}

// certOnDisk returns the node certificate on disk if it is still valid.
func (a *Agent) certOnDisk() (*x509.Certificate, bool) {
	data, err := os.ReadFile(a.pkiFiles().Cert())
	if err != nil {
		return nil, false
	}
	c, err := pki.ParseCertPEM(data)
	if err != nil || a.now().After(c.NotAfter) {
		return nil, false
	}
	// A crash between the renames of a new key and its certificate
	// leaves a pair that does not match: not usable.
	if _, err := tls.LoadX509KeyPair(a.pkiFiles().Cert(), a.pkiFiles().Key()); err != nil {
		return nil, false
	}
	return c, true
}

// renewCert issues the node certificate if it is missing, due, or no
// longer matches the node's addresses or the CA.
func (a *Agent) renewCert(ctx context.Context) error {
	a.certMu.Lock()
	defer a.certMu.Unlock()
	// A CA that went out of date is read again: it may have been
	// replaced meanwhile.
	if a.ca == nil || a.ca.ValidAt(a.now()) != nil {
		st, err := a.loadTrust(ctx)
		if err != nil {
			return err
		}
		a.ca, a.trust = st.CA, st.Trust
	}
	return a.ensureCertLocked(ctx)
}

// ensureCertLocked issues the node certificate from a.ca as needed, and
// writes a.trust and etcd's CRL file; callers hold certMu. A new
// certificate's serial is recorded in the store first (see
// recordSerial).
func (a *Agent) ensureCertLocked(ctx context.Context) error {
	req := a.certRequest()
	req.Record = func(serial *big.Int) error { return a.recordSerial(ctx, serial) }
	c, fresh, err := pki.EnsureNodeCert(a.ca, a.trust, a.pkiFiles(), req, a.now())
	if err != nil {
		return err
	}
	a.crlCA.Store(a.ca)
	if err := a.writeCRL(a.revoked.Get()); err != nil {
		a.log.Warn("cannot write etcd's revocation list", "error", err)
	}
	if fresh {
		a.met.certRenewals.Inc()
		a.log.Info("issued the node certificate", "expires", c.NotAfter, "renew-at", pki.RenewAt(c), "ca", pki.ShortName(a.ca.Cert))
		a.events.Note("issue-node-certificate", fmt.Sprintf("expires %s, from CA %s", c.NotAfter.UTC().Format(time.RFC3339), pki.ShortName(a.ca.Cert)))
	}
	a.certExpiry.Store(c.NotAfter.Unix())
	a.certMarked.Store(pki.CarriesName(c, a.nodeMarker()))
	a.met.certExpiry.Set(float64(c.NotAfter.Unix()))
	a.met.certificateExpiry.WithLabelValues("node").Set(float64(c.NotAfter.Unix()))
	a.met.certificateExpiry.WithLabelValues("ca").Set(float64(a.ca.Cert.NotAfter.Unix()))
	a.certInfo.Store(&peer.CertInfo{NotAfter: c.NotAfter.UTC(), CA: pki.ShortName(a.ca.Cert), CANotAfter: a.ca.Cert.NotAfter.UTC(),
		CAFingerprint: pki.Fingerprint(a.ca.Cert)})
	a.renewAt = pki.RenewAt(c)
	return nil
}

// ErrCAMismatch means this node read another CA or trust from the store
// than the leader that asked it to take them up; the leader asks again.
var ErrCAMismatch = errors.New("agent: the store's CA is not the one the leader read")

// ErrBadCARequest means a request to take up the store's CA was
// malformed.
var ErrBadCARequest = errors.New("agent: malformed CA request")

// caKeeper takes up the store's CA and trust for the node (see
// node.CAKeeper).
type caKeeper struct{ a *Agent }

// Sync reads the store's CA and trust again, checks that they are those
// the leader read, and writes them to the node's files: a new issuing CA
// gets the node a new key and certificate.
func (k caKeeper) Sync(ctx context.Context, trust []string, issuer string) error {
	a := k.a
	if len(trust) == 0 || len(trust) > 2 || !pki.ValidFingerprint(issuer) || slices.ContainsFunc(trust, func(fp string) bool { return !pki.ValidFingerprint(fp) }) {
		return fmt.Errorf("%w: the request names %d CAs to trust, or a fingerprint of the wrong form", ErrBadCARequest, len(trust))
	}
	if a.cfg.PKIDir != "" {
		return errors.New("agent: this agent takes its CA from --pki-dir, so a CA rotation through the store cannot reach it; " +
			"rotate a --pki-dir CA by replacing its files on every node")
	}
	a.certMu.Lock()
	defer a.certMu.Unlock()
	st, err := a.loadTrust(ctx)
	if err != nil {
		return err
	}
	got, gotIssuer := pki.Fingerprints(st.Trust), pki.Fingerprint(st.CA.Cert)
	if !slices.Equal(got, sortedCopy(trust)) || gotIssuer != issuer {
		return fmt.Errorf("%w: this node read CAs %v issued by %s, the leader %v issued by %s", ErrCAMismatch, got, gotIssuer, trust, issuer)
	}
	from := ""
	if a.ca != nil {
		from = pki.ShortName(a.ca.Cert)
	}
	a.ca, a.trust = st.CA, st.Trust
	if err := a.ensureCertLocked(ctx); err != nil {
		return err
	}
	a.log.Info("took up the store's CA", "issuer", pki.ShortName(st.CA.Cert), "from", from, "trusted", len(got))
	return nil
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return slices.Compact(c)
}

// trustReport is what the node reports of its CAs: the fingerprints its
// trust file holds, nil without TLS.
func (a *Agent) trustReport() []string {
	if !a.tlsEnabled() {
		return nil
	}
	return pki.FileFingerprints(a.pkiFiles().CA())
}

// renewLoop renews the node certificate when it is due, apart from the
// control loop, whose steps (a restore, say) may take long.
func (a *Agent) renewLoop(ctx context.Context) {
	every := min(time.Minute, max(a.cfg.CertValidity/30, time.Second))
	t := time.NewTicker(every)
	defer t.Stop()
	lastRefresh := a.now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.cfg.PKIDir == "" && a.now().Sub(lastRefresh) >= caRefreshEvery {
			lastRefresh = a.now()
			if err := a.refreshTrust(ctx); err != nil {
				a.log.Warn("cannot check the store's CA against this node's", "error", err)
			}
		}
		a.certMu.Lock()
		due := !a.now().Before(a.renewAt)
		a.certMu.Unlock()
		if !due {
			continue
		}
		if err := a.renewCert(ctx); err != nil {
			a.log.Error("cannot renew the node certificate; retrying", "error", err,
				"expires", time.Unix(a.certExpiry.Load(), 0).UTC())
		}
	}
}

// caRefreshEvery is how often an agent compares the store's CA and
// trust with its own, to catch up on a CA rotation's steps it missed.
var caRefreshEvery = 5 * time.Minute

// refreshTrust takes up the store's CA and trust when they differ from
// the node's, as far as that is safe without the leader: while a
// rotation record links the store's CAs to the node's (the leader takes
// every node through the same steps), or when the store trusts a subset
// of what the node trusts (a rotation ended while this agent was cut
// off). A CA unrelated to the node's, such as one generated after
// pki/ca.key was lost, is not taken up: moving nodes to it one by one
// would cut them off from each other. That is logged, with what to do.
func (a *Agent) refreshTrust(ctx context.Context) error {
	s, err := store.Open(ctx, a.cfg.BackupStore, store.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	st, err := pki.LoadStoreTrust(ctx, s, isNotFound, a.now())
	if err != nil {
		return err
	}
	a.certMu.Lock()
	defer a.certMu.Unlock()
	if a.ca != nil && a.ca.Cert.Equal(st.CA.Cert) && slices.Equal(pki.Fingerprints(a.trust), pki.Fingerprints(st.Trust)) {
		return nil
	}
	have, want := pki.Fingerprints(a.trust), pki.Fingerprints(st.Trust)
	if st.Rotation == nil && !subset(want, have) {
		a.log.Error("the store's CA is unrelated to the CAs this node trusts, and no CA rotation links them; not taking it up",
			"store-ca", pki.ShortName(st.CA.Cert), "trusted", have,
			"fix", "if the store's CA was replaced on purpose, restart the agents one at a time; to change the CA live, put the old one back and use etcd-manager-ctl rotate-ca")
		return nil
	}
	a.ca, a.trust = st.CA, st.Trust
	if err := a.ensureCertLocked(ctx); err != nil {
		return err
	}
	a.log.Warn("took up the store's CA, which changed while this agent missed the leader's steps", "issuer", pki.ShortName(st.CA.Cert), "trusted", want)
	return nil
}

// subset reports whether every element of a is in b.
func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// etcdTLSFiles are the files etcd serves with, nil with --etcd-insecure.
func (a *Agent) etcdTLSFiles() *etcdproc.TLSFiles {
	if a.cfg.EtcdInsecure {
		return nil
	}
	f := a.pkiFiles()
	return &etcdproc.TLSFiles{CA: f.CA(), Cert: f.Cert(), Key: f.Key(), CRL: f.CRL()}
}

// recordSerial records in the store the serial of a node certificate
// about to be issued to this node, so that revoke-node can list every
// certificate the node holds for etcd's CRL. With the store's CA a
// failure stops the issue (the store was just read; it is tried again);
// with a --pki-dir CA, which needs no store, the certificate is issued
// all the same, and only etcd's CRL would miss it: the agents refuse a
// revoked node by its ID whatever the serial.
func (a *Agent) recordSerial(ctx context.Context, serial *big.Int) error {
	wait := 30 * time.Second
	if a.cfg.PKIDir != "" {
		wait = 5 * time.Second // the certificate is issued anyway
	}
	err := func() error {
		ctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		s, err := store.Open(ctx, a.cfg.BackupStore, store.Options{Create: true})
		if err != nil {
			return err
		}
		defer s.Close()
		rec, err := json.Marshal(issuedRecord{NodeID: a.nodeID, Serial: pki.SerialHex(serial), IssuedAt: a.now().UTC()})
		if err != nil {
			return err
		}
		return s.Write(ctx, pki.StoreIssuedPrefix+a.nodeID+"/"+pki.SerialHex(serial), rec)
	}()
	if err != nil && a.cfg.PKIDir != "" {
		a.log.Warn("cannot record the new node certificate's serial in the store; issuing it all the same (its CA is --pki-dir's)",
			"serial", pki.SerialHex(serial), "error", err, "risk", "should this node be revoked, etcd's CRL will not list this certificate; the agents refuse it by node ID all the same")
		return nil
	}
	return err
}

// issuedRecord is what the store keeps of a node certificate issued.
type issuedRecord struct {
	NodeID   string    `json:"nodeId"`
	Serial   string    `json:"serial"`
	IssuedAt time.Time `json:"issuedAt"`
}

// revokedFile keeps the revocation list last read from the store, so
// that it is in force from the agent's start.
func (a *Agent) revokedFile() string { return filepath.Join(a.pkiFiles().Dir, "revoked.json") }

// loadRevocations puts the list saved by the last run in force; one
// that does not read is reported and left, for the store's to replace.
func (a *Agent) loadRevocations() {
	r, err := pki.ReadRevocationsFile(a.revokedFile())
	switch {
	case errors.Is(err, os.ErrNotExist):
		return
	case err == nil:
		a.revoked.Set(r)
		return
	}
	a.log.Warn("cannot read the revocation list this agent saved; the store's is in force from the first cycle", "file", a.revokedFile(), "error", err)
}

// takeRevocations puts the store's revocation list in force: the peer
// API and this agent's clients refuse the revoked nodes' certificates at
// once, etcd's CRL file lists their serials for its new connections, and
// the list is saved for the agent's next start.
func (a *Agent) takeRevocations(r pki.Revocations) {
	changed := !reflect.DeepEqual(a.revoked.Get(), r)
	a.revoked.Set(r)
	if changed {
		if data, err := r.Marshal(); err != nil {
			a.log.Warn("cannot save the revocation list", "error", err)
		} else if err := errors.Join(os.MkdirAll(filepath.Dir(a.revokedFile()), 0o700), pki.WriteFileAtomic(a.revokedFile(), data, 0o644)); err != nil {
			a.log.Warn("cannot save the revocation list", "file", a.revokedFile(), "error", err)
		}
	}
	if err := a.writeCRL(r); err != nil {
		a.log.Warn("cannot write etcd's revocation list", "error", err)
	}
}

// writeCRL writes etcd's CRL file from r, signed by the CA, when either
// changed since it was last written; without TLS for etcd, or before the
// CA is read, it writes nothing (etcd then starts without it).
func (a *Agent) writeCRL(r pki.Revocations) error {
	ca := a.crlCA.Load()
	if a.cfg.EtcdInsecure || ca == nil {
		return nil
	}
	a.crlMu.Lock()
	defer a.crlMu.Unlock()
	key := pki.Fingerprint(ca.Cert) + " " + strings.Join(r.Serials(), ",")
	path := a.pkiFiles().CRL()
	if _, err := os.Stat(path); err == nil && key == a.crlFor {
		return nil
	}
	der, err := r.CRL(ca, a.now())
	if err != nil {
		return err
	}
	if err := pki.WriteFileAtomic(path, der, 0o644); err != nil {
		return err
	}
	a.crlFor = key
	return nil
}
