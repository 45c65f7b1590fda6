package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/etcd-manager/etcd-manager/internal/agent"
	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The outcomes of a doctor check.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
	checkSkip = "skip"
)

// doctorCheck is one check doctor made: what it found and, when it is
// not ok, how to fix it.
type doctorCheck struct {
	Check  string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// doctorOptions are doctor's own flags: what this node's agent would use.
type doctorOptions struct {
	etcdBinDir    string
	dataDir       string
	listenAddress string
	ports         []int
}

// Clock skews doctor reports: beyond skewWarn a clock is worth fixing;
// beyond half the leader lease an agent may take the store lock while
// another still holds it by its own clock.
const skewWarn = 2 * time.Second

var skewFail = controller.DefaultLeaderLease / 2

// doctorNow is this machine's clock, as doctor reads it.
var doctorNow = time.Now

func doctorCommand(o *options, stdout io.Writer) *cobra.Command {
	d := doctorOptions{etcdBinDir: etcdproc.DefaultBinDir, listenAddress: "0.0.0.0",
		ports: []int{agent.DefaultPeerPort, agent.DefaultClientPort, agent.DefaultEtcdPeerPort, agent.DefaultQuarantinePort}}
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can run an agent: the store, credentials, etcd, ports, clocks and disk",
		Long: `doctor checks what an agent on this machine needs, and says how to fix each
problem it finds:
  store        the backup store answers, with the credentials this environment
               gives (or, for a file:// store not made yet, that an agent can
               create it);
  store-write  an object can be written, read back and removed under doctor/;
  store-clock  this machine's clock agrees with the store's (an object's
               modification time);
  agent-clocks no agent's record in the store is dated ahead of this clock;
  etcd         the spec's etcd version is installed under --etcd-bin-dir and
               runs;
  ports        the agent's and etcd's ports are free on --listen-address;
  disk         --data-dir's file system has room to restore the newest backup.
Clocks are bad beyond half the leader lease (` + skewFail.String() + `), worth fixing beyond
` + skewWarn.String() + `. A port in use is a warning: an agent may run here already. doctor
exits 1 when a check fails.`,
		Example: `  etcd-manager-ctl --backup-store=s3://my-bucket/etcd/main doctor --data-dir=/var/lib/etcd-manager/main
  etcd-manager-ctl --backup-store=file:///var/lib/etcd-manager/backups/main doctor -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, p := range d.ports {
				if p <= 0 || p > 65535 {
					return usagef("--ports: %d is not a port", p)
				}
			}
			if net.ParseIP(d.listenAddress) == nil {
				return usagef("--listen-address %q is not an IP address", d.listenAddress)
			}
			return o.doctor(cmd.Context(), stdout, d)
		},
	}
	cmd.Flags().StringVar(&d.etcdBinDir, "etcd-bin-dir", d.etcdBinDir, "where the agent looks for etcd installs (etcd-v<version>/etcd), as its --etcd-bin-dir")
	cmd.Flags().StringVar(&d.dataDir, "data-dir", "", "the agent's --data-dir, whose disk must hold a restore (the disk check is skipped without it)")
	cmd.Flags().StringVar(&d.listenAddress, "listen-address", d.listenAddress, "the address the ports are checked on")
	cmd.Flags().IntSliceVar(&d.ports, "ports", d.ports, "the ports the agent and its etcd listen on: the peer API, etcd's client, peer and quarantine ports")
	return cmd
}

func (o *options) doctor(ctx context.Context, w io.Writer, d doctorOptions) error {
	if o.backupStore == "" {
		return usagef("--backup-store is required, for example --backup-store=file:///tmp/etcd-manager/backups/test")
	}
	var checks []doctorCheck
	add := func(c doctorCheck) { checks = append(checks, c) }
	s, c := o.doctorStore(ctx)
	add(c)
	var cs *spec.ClusterSpec
	var newest *backup.Info
	if s != nil {
		defer s.Close()
		add(doctorWrite(ctx, s))
		add(doctorStoreClock(ctx, s))
		add(doctorAgentClocks(ctx, s))
		if got, err := s.ReadSpec(ctx); err == nil {
			cs = &got
		}
		newest, _ = backup.Newest(ctx, s, backup.Want{NotAfter: time.Now().Add(spec.FutureSkew), MaxReads: 10})
	} else {
		for _, name := range []string{"store-write", "store-clock", "agent-clocks"} {
			add(doctorCheck{Check: name, Status: checkSkip, Detail: "the store cannot be read"})
		}
	}
	add(doctorEtcd(ctx, d.etcdBinDir, cs))
	add(doctorPorts(d.listenAddress, d.ports))
	add(doctorDisk(d.dataDir, newest))

	failed := 0
	for _, c := range checks {
		if c.Status == checkFail {
			failed++
		}
	}
	err := o.emit(w, checks, func() error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, c := range checks {
			fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Check, c.Detail)
			if c.Fix != "" {
				fprintf(tw, "\t\tfix: %s\n", c.Fix)
			}
		}
		return tw.Flush()
	})
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("doctor: %d of %d checks failed", failed, len(checks))
	}
	return nil
}

// doctorStore opens the store once, without retrying. A file:// store
// that does not exist yet is fine when an agent could create it.
func (o *options) doctorStore(ctx context.Context) (*store.Store, doctorCheck) {
	c := doctorCheck{Check: "store"}
	s, err := store.Open(ctx, o.backupStore, store.Options{})
	if err == nil {
		c.Status, c.Detail = checkOK, o.backupStore+" answers"
		if !strings.HasPrefix(o.backupStore, "file:") {
			c.Detail += ", with the credentials this environment gives"
		}
		return s, c
	}
	c.Status, c.Detail = checkFail, err.Error()
	switch {
	case errors.Is(err, store.ErrBadURL):
		c.Fix = "correct --backup-store (see docs/backup-store.md for each scheme's URL and parameters)"
	case errors.Is(err, store.ErrNoCredentials), errors.Is(err, store.ErrDenied):
		c.Fix = "give this environment the store's credentials, as the error says; the agents read the same variables"
	case errors.Is(err, store.ErrNoBucket):
		c.Fix = "create the bucket or container, or correct --backup-store"
	case strings.HasPrefix(o.backupStore, "file:"):
		if dir, ok := fileStoreDir(o.backupStore); ok {
			if parent, perr := creatable(dir); perr == nil {
				c.Status, c.Detail = checkWarn, fmt.Sprintf("%s does not exist yet; an agent creates it (%s is writable)", dir, parent)
				c.Fix = "nothing, unless the path is a typo: configure-cluster and the agents create it"
				return nil, c
			} else {
				c.Fix = perr.Error()
			}
		}
	default:
		c.Fix = "check the store's address (?endpoint=), the network to it, and that it runs"
	}
	return nil, c
}

// fileStoreDir is the directory of a file:// store URL.
func fileStoreDir(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "file" || u.Path == "" {
		return "", false
	}
	return filepath.Clean(u.Path), true
}

// creatable checks that dir could be created: its nearest existing parent
// is a writable directory. It returns that parent.
func creatable(dir string) (string, error) {
	p := dir
	for {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return p, fmt.Errorf("%s is not a directory: choose another --backup-store path", p)
			}
			if err := unix.Access(p, unix.W_OK|unix.X_OK); err != nil {
				return p, fmt.Errorf("%s is not writable by this user: run as the agents' user, or create %s for them", p, dir)
			}
			return p, nil
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			return p, fmt.Errorf("%s: %v", p, err)
		}
		next := filepath.Dir(p)
		if next == p {
			return p, fmt.Errorf("no parent of %s exists", dir)
		}
		p = next
	}
}

// doctorProbe is where doctor writes its probe object.
func doctorProbe() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, strings.ToLower(host))
	return "doctor/probe-" + host + "-" + strconv.FormatInt(time.Now().UnixNano(), 10)
}

func doctorWrite(ctx context.Context, s *store.Store) doctorCheck {
	c := doctorCheck{Check: "store-write"}
	key := doctorProbe()
	data := []byte("etcd-manager-ctl doctor " + time.Now().UTC().Format(time.RFC3339Nano))
	if err := s.Write(ctx, key, data); err != nil {
		c.Status, c.Detail, c.Fix = checkFail, "cannot write "+key+": "+err.Error(), "grant this user (and the agents) write and delete on the store's prefix"
		return c
	}
	defer s.Delete(ctx, key)
	got, err := s.ReadMax(ctx, key, int64(len(data)))
	switch {
	case err != nil:
		c.Status, c.Detail, c.Fix = checkFail, "wrote "+key+" but cannot read it back: "+err.Error(), "grant read on the store's prefix"
	case !bytes.Equal(got, data):
		c.Status, c.Detail, c.Fix = checkFail, "read back "+key+" changed", "the store does not keep what is written to it: check what serves it"
	default:
		if err := s.Delete(ctx, key); err != nil {
			c.Status, c.Detail, c.Fix = checkFail, "cannot remove "+key+": "+err.Error(), "grant delete on the store's prefix: retention and the command queue remove objects"
			return c
		}
		c.Status, c.Detail = checkOK, "wrote, read back and removed "+key
	}
	return c
}

// doctorStoreClock compares this clock with the store's, from the
// modification time it gives an object written now.
func doctorStoreClock(ctx context.Context, s *store.Store) doctorCheck {
	c := doctorCheck{Check: "store-clock"}
	key := doctorProbe()
	before := doctorNow()
	if err := s.Write(ctx, key, []byte("clock")); err != nil {
		c.Status, c.Detail = checkSkip, "cannot write a probe: "+err.Error()
		return c
	}
	after := doctorNow()
	defer s.Delete(ctx, key)
	mod, err := s.ModTime(ctx, key)
	if err != nil {
		c.Status, c.Detail = checkSkip, "cannot read the probe's time: "+err.Error()
		return c
	}
	// Stores keep whole seconds, some: the probe is within the second
	// before the write began and the one after it ended.
	var skew time.Duration
	switch {
	case mod.Before(before.Truncate(time.Second)):
		skew = before.Sub(mod)
	case mod.After(after.Add(time.Second)):
		skew = mod.Sub(after)
	}
	return skewCheck(c, skew, "the store's clock", "this machine's clock is "+skew.Round(time.Millisecond).String()+" off the store's")
}

// doctorAgentClocks looks for agents whose records are dated ahead of
// this clock: an agent publishes every few seconds, so a record from the
// future is a clock ahead (one behind cannot be told from a stale record).
func doctorAgentClocks(ctx context.Context, s *store.Store) doctorCheck {
	c := doctorCheck{Check: "agent-clocks"}
	recs, err := peer.StoreRecords(ctx, s, peer.ReadLimits{})
	now := doctorNow()
	if err != nil && len(recs) == 0 {
		c.Status, c.Detail = checkSkip, "cannot read the agents' records: "+err.Error()
		return c
	}
	if len(recs) == 0 {
		c.Status, c.Detail = checkSkip, "no agent has published a record yet"
		return c
	}
	var worst time.Duration
	who := ""
	for _, r := range recs {
		if ahead := r.Updated.Sub(now); ahead > worst {
			worst, who = ahead, r.NodeID
		}
	}
	return skewCheck(c, worst, fmt.Sprintf("%d agents' records", len(recs)),
		fmt.Sprintf("node %s's record is dated %s ahead of this clock", printable(who), worst.Round(time.Millisecond)))
}

func skewCheck(c doctorCheck, skew time.Duration, what, bad string) doctorCheck {
	switch {
	case skew > skewFail:
		c.Status, c.Detail = checkFail, bad
	case skew > skewWarn:
		c.Status, c.Detail = checkWarn, bad
	default:
		c.Status, c.Detail = checkOK, "within "+skewWarn.String()+" of "+what
		return c
	}
	c.Fix = "run NTP (chrony or systemd-timesyncd) on every node, and on this machine"
	return c
}

// doctorEtcd checks that the spec's etcd version (or, with no spec yet,
// any) is installed under binDir and runs.
func doctorEtcd(ctx context.Context, binDir string, cs *spec.ClusterSpec) doctorCheck {
	c := doctorCheck{Check: "etcd"}
	installed := etcdproc.InstalledVersions(binDir)
	fix := fmt.Sprintf("install etcd-v<version>/etcd under %s (make etcd in a checkout, or the image), or pass the agent's --etcd-bin-dir", binDir)
	if cs == nil {
		if len(installed) == 0 {
			c.Status, c.Detail, c.Fix = checkFail, "no etcd is installed under "+binDir, fix
		} else {
			c.Status, c.Detail = checkOK, "installed under "+binDir+": "+strings.Join(installed, ", ")+" (no spec yet to check against)"
		}
		return c
	}
	v, err := spec.ParseSupportedVersion(cs.EtcdVersion)
	if err != nil {
		c.Status, c.Detail, c.Fix = checkFail, "the spec's etcd version: "+err.Error(), "correct it with configure-cluster --etcd-version"
		return c
	}
	bins, err := etcdproc.FindBinaries(binDir, v)
	if err == nil {
		err = bins.CheckVersion(ctx)
	}
	if err != nil {
		c.Status, c.Detail, c.Fix = checkFail, fmt.Sprintf("the spec's etcd %s: %v (installed: %s)", v, err, dash(strings.Join(installed, ", "))), fix
		return c
	}
	c.Status, c.Detail = checkOK, fmt.Sprintf("the spec's etcd %s runs from %s (installed: %s)", v, bins.Dir, strings.Join(installed, ", "))
	return c
}

// doctorPorts checks that each port is free on address.
func doctorPorts(address string, ports []int) doctorCheck {
	c := doctorCheck{Check: "ports"}
	var busy, free []string
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(p)))
		if err != nil {
			busy = append(busy, strconv.Itoa(p))
			continue
		}
		l.Close()
		free = append(free, strconv.Itoa(p))
	}
	if len(busy) == 0 {
		c.Status, c.Detail = checkOK, "free on "+address+": "+strings.Join(free, ", ")
		return c
	}
	c.Status, c.Detail = checkWarn, "in use on "+address+": "+strings.Join(busy, ", ")
	c.Fix = "expected if an agent and its etcd run here; otherwise stop what holds them (ss -ltnp), or give the agent other ports (--peer-port, --client-urls, --peer-urls, --quarantine-client-urls)"
	return c
}

// doctorDisk checks that dataDir's disk can hold a restore of the newest
// backup: the fetched snapshot and the member restored from it, with a
// tenth to spare.
func doctorDisk(dataDir string, newest *backup.Info) doctorCheck {
	c := doctorCheck{Check: "disk"}
	if dataDir == "" {
		c.Status, c.Detail = checkSkip, "no --data-dir given"
		return c
	}
	dir, err := existingParent(dataDir)
	if err != nil {
		c.Status, c.Detail, c.Fix = checkFail, err.Error(), "create --data-dir's parent, or choose another"
		return c
	}
	free, _, err := etcdproc.DiskSpace(dir)
	if err != nil {
		c.Status, c.Detail = checkFail, err.Error()
		return c
	}
	if newest == nil || newest.Meta.Size <= 0 {
		c.Status, c.Detail = checkOK, fmt.Sprintf("%s free under %s (no backup whose size is known yet)", size(free), dir)
		return c
	}
	need := newest.Meta.Size * 2
	need += need / 10
	if free < need {
		c.Status, c.Detail = checkFail, fmt.Sprintf("%s free under %s; restoring the newest backup %s (%s) needs %s", size(free), dir, newest.Name, size(newest.Meta.Size), size(need))
		c.Fix = "give --data-dir's file system more room, or compact and defragment the cluster so that its backups shrink"
		return c
	}
	c.Status, c.Detail = checkOK, fmt.Sprintf("%s free under %s; restoring the newest backup %s (%s) needs %s", size(free), dir, newest.Name, size(newest.Meta.Size), size(need))
	return c
}

// existingParent is dir, or its nearest parent that exists.
func existingParent(dir string) (string, error) {
	p := filepath.Clean(dir)
	for {
		if st, err := os.Stat(p); err == nil {
			if !st.IsDir() {
				return "", fmt.Errorf("%s is not a directory", p)
			}
			return p, nil
		}
		next := filepath.Dir(p)
		if next == p {
			return "", fmt.Errorf("no parent of %s exists", dir)
		}
		p = next
	}
}
