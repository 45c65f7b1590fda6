package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

func (o *options) status(ctx context.Context, w io.Writer) error {
	creds, tlsCfg, err := o.peerCreds(ctx)
	if err != nil {
		return err
	}
	var st cli.ClusterStatus
	var s *store.Store
	if o.backupStore != "" {
		if s, err = o.openStore(ctx, false); err != nil {
			return err
		}
		defer s.Close()
		if cs, err := s.ReadSpec(ctx); err == nil {
			st.Spec = &cs
		}
		if r, err := pki.LoadRotation(ctx, s, isNotFound); err == nil && r != nil {
			st.CARotation = r.Phase
		}
		if r, err := readRevocations(ctx, s); err == nil {
			st.Revoked = r.NodeIDs()
		} else {
			fprintf(o.stderr, "warning: the revocation list is unreadable: %v\n", err)
		}
		if d, err := s.ReadDrills(ctx); err == nil {
			st.RestoreDrills = d
		} else {
			fprintf(o.stderr, "warning: the restore drills' record is unreadable: %v\n", err)
		}
		if f, err := s.ReadBackupFailure(ctx); err == nil {
			st.BackupFailure = f
		} else {
			fprintf(o.stderr, "warning: the record of the last failed backup is unreadable: %v\n", err)
		}
	}
	recs, err := o.discoverAgents(ctx, s)
	if err != nil {
		return err
	}
	errs := askAgents(ctx, recs, o.clusterName, creds, &st)
	if len(st.Agents) == 0 {
		for _, err := range errs {
			if msg := err.Error(); strings.Contains(msg, "tls:") || strings.Contains(msg, "handshake") || strings.Contains(msg, "server preface") {
				return fmt.Errorf("no agent accepted the connection: %w; the agents require a client certificate from the cluster's CA (see issue-client-cert), or --insecure if they run with --insecure", err)
			}
		}
		noAgent := fmt.Errorf("no agent answered: discovery %q found %d address(es) %v; are the agents running, and is --discovery the one they use?",
			o.discovery, len(recs), st.Unreachable)
		if s == nil {
			return noAgent
		}
		// What the store says is worth as much while the agents are
		// down: it is printed, and the status still fails.
		o.storeStatus(ctx, s, &st)
		if err := o.emit(w, st, func() error { printStoreStatus(w, st); return nil }); err != nil {
			return err
		}
		return noAgent
	}
	sort.Slice(st.Agents, func(i, j int) bool { return st.Agents[i].ID < st.Agents[j].ID })
	sort.Strings(st.Unreachable)
	httpc := etcdproc.NewHTTPClient(tlsCfg)
	for _, a := range st.Agents {
		if a.Healthy && a.ClientURL != "" {
			if v, err := etcdproc.ClusterVersion(ctx, httpc, a.ClientURL); err == nil {
				st.ClusterVersion = v
				break
			}
		}
	}

	return o.emit(w, st, func() error { return printStatus(w, st) })
}

// printStatus renders the status as text.
func printStatus(w io.Writer, st cli.ClusterStatus) error {
	if st.Spec != nil {
		fprintf(w, "spec:   %s\n", st.Spec)
	}
	leader := st.Leader
	if leader == "" {
		leader = "(none)"
	}
	fprintf(w, "leader: %s (etcd leader: %s)\n", leader, dash(st.EtcdLeader))
	fprintf(w, "cluster version: %s\n\n", dash(st.ClusterVersion))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDRESS\tROLE\tETCD\tHEALTH\tDB SIZE\tCLOCK OFFSET\tCLIENT URL\tAGENT")
	for _, a := range st.Agents {
		health := "-"
		if a.Role != "standby" {
			health = "unhealthy"
			if a.Healthy {
				health = "healthy"
			}
		}
		fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Address, a.Role, dash(a.EtcdVersion), health, size(a.DBSize),
			a.ClockOffset.Round(time.Millisecond), dash(a.ClientURL), dash(a.AgentVersion))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Unreachable) > 0 {
		fprintf(w, "\nunreachable: %s\n", strings.Join(st.Unreachable, ", "))
	}
	for _, a := range st.Agents {
		if st.Spec != nil && a.Role != cli.RoleStandby && !a.EtcdSettings.Equal(st.Spec.EtcdSettings) {
			fprintf(w, "\nagent %s runs etcd with other settings than the spec's, until the roll reaches it: [%s]\n", a.ID, a.EtcdSettings)
		}
		if a.Procedure != "" {
			fprintf(w, "\nagent %s drives %s\n", a.ID, a.Procedure)
		}
		if a.LockRefused != "" {
			fprintf(w, "\nagent %s will not take the store lock: %s\n", a.ID, a.LockRefused)
		}
		if tr := a.Transfer; tr != nil {
			fprintf(w, "\nagent %s: %s\n", a.ID, describeTransfer(*tr, time.Now()))
		}
	}
	printCerts(w, st.Agents, time.Now())
	if st.CARotation != "" {
		fprintf(w, "\nCA rotation at phase %s: %s\n", st.CARotation, rotationNext(st.CARotation))
	}
	printRevoked(w, st.Revoked)
	printMaintenance(w, st.Maintenance)
	printBackupRecords(w, st.RestoreDrills, st.BackupFailure)
	printWarnings(w, st.Warnings)
	if len(st.Failing) > 0 {
		fmt.Fprintf(w, "\nfailing on the leader (retried after a backoff; the rest goes on):\n")
		for _, f := range st.Failing {
			fprintf(w, "  %s\n", f)
		}
	}
	return nil
}

// printBackupRecords renders the store's records of the restore drills
// and of the last failed backup.
func printBackupRecords(w io.Writer, d *spec.DrillRecord, f *spec.BackupFailure) {
	if d == nil && f == nil {
		return
	}
	fmt.Fprintf(w, "\nbackups (from the store):\n")
	if d != nil {
		l := d.Last
		what := "passed"
		switch l.Outcome {
		case spec.EventFailed:
			what = "FAILED"
		case spec.DrillNotRun:
			what = "could not run"
		}
		fprintf(w, "  last restore drill: %s at %s on %s, backup %s, took %.1fs", what, l.Time.Format(time.RFC3339), l.Node, dash(l.Backup), l.Seconds)
		if l.Message != "" {
			fprintf(w, ": %s", l.Message)
		}
		fprintf(w, "\n")
		if fl := d.Failing(); fl != nil && l.Outcome != spec.EventFailed {
			fprintf(w, "  last drill that FAILED, none passed since: %s on %s, backup %s: %s\n", fl.Time.Format(time.RFC3339), fl.Node, dash(fl.Backup), fl.Message)
		}
		if p := d.LastPassed; p != nil && l.Outcome != spec.EventOK {
			fprintf(w, "  last drill that passed: %s, backup %s\n", p.Time.Format(time.RFC3339), dash(p.Backup))
		}
	}
	if f != nil {
		fprintf(w, "  last failed backup: %s on %s (%s): %s\n", f.Time.Format(time.RFC3339), f.Node, dash(f.Kind), f.Message)
	}
}

// printWarnings renders the leader's warnings.
func printWarnings(w io.Writer, warnings []string) {
	if len(warnings) == 0 {
		return
	}
	fmt.Fprintf(w, "\nwarnings from the leader:\n")
	for _, l := range warnings {
		fprintf(w, "  %s\n", l)
	}
}

// printCerts renders each agent's node certificate and CA: during a CA
// rotation, which nodes have moved. Nothing without TLS.
func printCerts(w io.Writer, agents []cli.AgentStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := false
	for _, a := range agents {
		c := a.Cert
		if c == nil {
			continue
		}
		if !header {
			fmt.Fprintf(tw, "\nID\tCERT EXPIRES\tCA\tCA EXPIRES\tTRUSTS\tETCD TRUSTS\n")
			header = true
		}
		fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, expiry(c.NotAfter, now), c.CA, expiry(c.CANotAfter, now), shortFPs(a.Trust), shortFPs(a.EtcdTrust))
	}
	tw.Flush()
}

// shortFPs names CAs by the start of their fingerprints, as the CA
// column does.
func shortFPs(fps []string) string {
	if len(fps) == 0 {
		return "-"
	}
	out := make([]string, len(fps))
	for i, fp := range fps {
		out[i] = fp[:min(len(fp), 11)]
	}
	return strings.Join(out, ",")
}

// expiry is a date with the time left until it, in days.
func expiry(t, now time.Time) string {
	left := t.Sub(now)
	if left <= 0 {
		return t.Format(time.DateOnly) + " (expired)"
	}
	return fmt.Sprintf("%s (in %dd)", t.Format(time.DateOnly), int(left.Hours()/24))
}

// printMaintenance renders the leader's maintenance record.
func printMaintenance(w io.Writer, m *peer.Maintenance) {
	if m == nil {
		return
	}
	if len(m.Alarms) > 0 {
		fprintf(w, "\netcd alarms: %s\n", strings.Join(m.Alarms, ", "))
	}
	if m.LastDefrag == nil && m.LastHashCheck == nil && m.LastDiscard == nil {
		return
	}
	fmt.Fprintf(w, "\nmaintenance (since the leader began to lead):\n")
	if d := m.LastDefrag; d != nil {
		mode := "in place"
		if d.Isolated {
			mode = "isolated"
		}
		fprintf(w, "  last defragmentation: %s (%s) at %s, took %s, database %s -> %s\n", d.Node, mode, d.At.Format(time.RFC3339),
			d.Duration.Round(time.Millisecond), size(d.SizeBefore), size(d.SizeAfter))
	}
	if h := m.LastHashCheck; h != nil {
		fprintf(w, "  last hash comparison: %s at revision %d, %s\n", h.Outcome, h.Revision, h.At.Format(time.RFC3339))
	}
	if d := m.LastDiscard; d != nil {
		fprintf(w, "  last member rebuilt for disagreeing data: %s at %s (%s)\n", d.Node, d.At.Format(time.RFC3339), d.Reason)
	}
}

// peerCreds are the credentials for the agents' peer API, and the TLS
// config behind them (nil with --insecure).
func (o *options) peerCreds(ctx context.Context) (peer.TransportCredentials, *tls.Config, error) {
	if o.insecure {
		return peer.InsecureCredentials(), nil, nil
	}
	tlsCfg, err := o.clientTLS(ctx)
	if err != nil {
		return nil, nil, err
	}
	return credentials.NewTLS(tlsCfg), tlsCfg, nil
}

// discoverAgents finds the agents through --discovery; s (nil without
// --backup-store) holds the records of --discovery=store.
func (o *options) discoverAgents(ctx context.Context, s *store.Store) ([]peer.Record, error) {
	disc, err := peer.ParseDiscovery(o.discovery, peer.DiscoveryOptions{
		Store: func(context.Context) (peer.BlobStore, error) {
			if s == nil {
				return nil, errors.New("--discovery=store needs --backup-store")
			}
			return s, nil
		},
		PeerPort: o.peerPort,
		MaxAge:   10 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	return disc.Poll(ctx)
}

// askAgents asks every discovered agent for its info, in parallel, and
// fills st with what they answer; it returns the errors of those that did
// not.
func askAgents(ctx context.Context, recs []peer.Record, clusterName string, creds peer.TransportCredentials, st *cli.ClusterStatus) []error {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	seen := map[string]bool{}
	for _, r := range recs {
		name := clusterName
		if name == "" {
			name = r.ClusterName
		}
		if seen[r.Address] {
			continue
		}
		seen[r.Address] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := askInfo(ctx, r.Address, name, creds)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st.Unreachable = append(st.Unreachable, r.Address)
				errs = append(errs, err)
				return
			}
			st.Add(r.Address, info)
		}()
	}
	wg.Wait()
	return errs
}

func askInfo(ctx context.Context, addr, clusterName string, creds peer.TransportCredentials) (peer.NodeInfo, error) {
	c, err := peer.Dial(addr, clusterName, creds)
	if err != nil {
		return peer.NodeInfo{}, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return c.Info(ctx)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func size(b int64) string {
	switch {
	case b == 0:
		return "-"
	case b < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	case b < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	}
}

// storeStatus fills in st what the store says of the cluster while no
// agent answers: the newest backup and restorable point, and the queued
// commands (the spec, the drills and the last failed backup are read
// already).
func (o *options) storeStatus(ctx context.Context, s *store.Store, st *cli.ClusterStatus) {
	st.StoreOnly = true
	newest, err := backup.Newest(ctx, s, backup.Want{NotAfter: time.Now().Add(spec.FutureSkew), MaxReads: 10})
	switch {
	case err != nil:
		fprintf(o.stderr, "warning: the newest backup is unreadable: %v\n", err)
	case newest != nil:
		st.NewestBackup = newest.Name
		if at, err := history.NewestPoint(ctx, s, newest.Meta.ClusterToken, newest, true); !at.IsZero() {
			st.Restorable = &at
		} else if err != nil {
			fprintf(o.stderr, "warning: the captured revisions are unreadable: %v\n", err)
		}
	}
	if rows, err := storeops.CommandRows(ctx, s); err == nil {
		st.Commands = rows
	} else {
		fprintf(o.stderr, "warning: the command queue is unreadable: %v\n", err)
	}
}

// printStoreStatus renders what the store says while no agent answers.
func printStoreStatus(w io.Writer, st cli.ClusterStatus) {
	fprintf(w, "no agent answered; the store says:\n")
	if st.Spec != nil {
		fprintf(w, "spec:   %s\n", st.Spec)
	} else {
		fprintf(w, "spec:   none (set one with configure-cluster)\n")
	}
	fprintf(w, "newest backup: %s\n", dash(st.NewestBackup))
	if st.Restorable != nil {
		fprintf(w, "newest restorable point: %s\n", st.Restorable.UTC().Format(time.RFC3339))
	}
	if st.CARotation != "" {
		fprintf(w, "CA rotation at phase %s\n", st.CARotation)
	}
	printRevoked(w, st.Revoked)
	printBackupRecords(w, st.RestoreDrills, st.BackupFailure)
	if len(st.Commands) > 0 {
		fprintf(w, "\nqueued commands:\n")
		for _, c := range st.Commands {
			fprintf(w, "  %s  %s  %s\n", c.ID, c.Kind, c.State)
		}
	}
}

// printRevoked names the revoked nodes, if any.
func printRevoked(w io.Writer, ids []string) {
	if len(ids) > 0 {
		fprintf(w, "\nrevoked nodes (their certificates are refused): %s\n", strings.Join(ids, ", "))
	}
}

// describeTransfer says how far a transfer an agent reports has gone,
// with its rate since it began.
func describeTransfer(tr spec.Transfer, now time.Time) string {
	line := dash(tr.What) + ": " + size(tr.Done)
	if tr.Total > 0 {
		line += fmt.Sprintf(" of %s (%d%%)", size(tr.Total), min(tr.Done*100/tr.Total, 100))
	}
	// A rate over less than a second says more of buffers than of the
	// transfer.
	if secs := now.Sub(time.Unix(0, int64(tr.Started))).Seconds(); tr.Started > 0 && secs >= 1 {
		line += fmt.Sprintf(", %s/s", size(int64(float64(tr.Done)/secs)))
	}
	return line
}
