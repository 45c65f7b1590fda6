package controller

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Agent is one node's etcd-manager: it supervises the local etcd and runs
// the control loop. Create it with NewAgent and call Run once.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	layout etcdproc.Layout
	proc   *etcdproc.Supervisor
	now    func() time.Time

	state  etcdproc.State
	store  *store.Store
	client *clientv3.Client
	// clientEndpoint is the endpoint client was made for.
	clientEndpoint string
	// lastInfo is the last info-level report, logged again only when it
	// changes; warnings and errors are logged every cycle.
	lastInfo string
}

// NewAgent returns an agent for a validated, completed configuration.
func NewAgent(cfg Config, log *slog.Logger) *Agent {
	layout := etcdproc.Layout{Root: cfg.DataDir}
	return &Agent{
		cfg:    cfg,
		log:    log,
		layout: layout,
		proc: etcdproc.NewSupervisor(etcdproc.SupervisorConfig{
			PIDFile:     layout.PIDFile(),
			StopTimeout: cfg.EtcdStopTimeout,
		}, log.With("component", "etcd")),
		now: time.Now,
	}
}

// Run runs the agent until ctx is cancelled, then stops etcd gracefully.
// It returns an error only for problems it cannot ride out (a data dir in
// use by another agent, or an unreadable state file); everything else is
// logged and retried.
func (a *Agent) Run(ctx context.Context) error {
	unlock, err := a.layout.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	a.state, err = a.layout.LoadState()
	if err != nil {
		return err
	}
	a.log.Info("agent starting", "node-id", a.state.NodeID, "cluster-name", a.cfg.ClusterName,
		"data-dir", a.cfg.DataDir, "backup-store", a.cfg.BackupStore, "member", a.state.Member != nil)

	defer a.shutdown()

	ticker := time.NewTicker(a.cfg.LoopInterval)
	defer ticker.Stop()
	for {
		a.cycle(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (a *Agent) shutdown() {
	// The caller's context is done; give etcd its own time to stop.
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.EtcdStopTimeout+5*time.Second)
	defer cancel()
	if err := a.proc.Stop(ctx); err != nil {
		a.log.Error("stopping etcd failed", "error", err)
	}
	if a.client != nil {
		_ = a.client.Close()
	}
	if a.store != nil {
		_ = a.store.Close()
	}
	a.log.Info("agent stopped")
}

// cycle runs one observe → plan → act round. It never panics on bad data
// and never returns an error: problems are logged and retried next cycle.
func (a *Agent) cycle(ctx context.Context) {
	obs := a.observe(ctx)
	for _, act := range Plan(obs) {
		if ctx.Err() != nil {
			return
		}
		if r, ok := act.(Report); ok {
			a.report(ctx, r)
			continue
		}
		a.log.Info("performing action", "action", act.String())
		if err := a.execute(ctx, act); err != nil {
			a.log.Error("action failed; will retry", "action", act.String(), "error", err)
			return
		}
		if act.Mutates() {
			// Re-observe before acting again.
			return
		}
	}
}

func (a *Agent) report(ctx context.Context, r Report) {
	if r.Level <= slog.LevelInfo {
		if r.Msg == a.lastInfo {
			return
		}
		a.lastInfo = r.Msg
	} else {
		a.lastInfo = ""
	}
	a.log.Log(ctx, r.Level, r.Msg, r.Attrs...)
}

func (a *Agent) observe(ctx context.Context) Observed {
	self := Node{ID: a.state.NodeID, Member: a.state.Member}
	if m := a.state.Member; m != nil {
		self.HasData = a.layout.HasEtcdData(m.ClusterToken)
	}
	st := a.proc.Status()
	self.EtcdWanted = st.Wanted
	if st.Wanted && st.PID != 0 {
		if ms, err := a.localStatus(ctx, st.Spec); err == nil {
			self.Healthy = true
			self.Version = ms.Version
		}
	}
	obs := Observed{Self: self, Peers: []Node{self}, Leader: true}

	s, err := a.openStore(ctx)
	if err != nil {
		obs.StoreErr = err
		return obs
	}
	cs, err := s.ReadSpec(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil && !errors.Is(err, store.ErrUnreachable):
		obs.SpecErr = err
	case err != nil:
		obs.StoreErr = err
		return obs
	default:
		if _, verr := cs.Validate(); verr != nil {
			obs.SpecErr = fmt.Errorf("controller: %s in %s: %w", store.KeySpec, s.URL(), verr)
		} else {
			obs.Spec = &cs
			v, _ := spec.ParseVersion(cs.EtcdVersion)
			if _, berr := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v); berr != nil {
				obs.SpecBinaryErr = berr
			}
		}
	}
	created, err := s.ReadCreated(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		obs.StoreErr = err
	case err != nil:
		// A marker that exists but cannot be parsed still marks the cluster
		// as created: refusing to create is the safe side.
		a.log.Warn("cluster-created marker is unreadable; treating the cluster as created", "error", err)
		obs.Created = &created
	default:
		obs.Created = &created
	}
	return obs
}

// openStore opens the backup store once, retrying on later cycles if it
// is unreachable.
func (a *Agent) openStore(ctx context.Context) (*store.Store, error) {
	if a.store != nil {
		return a.store, nil
	}
	s, err := store.Open(ctx, a.cfg.BackupStore, store.Options{Create: true})
	if err != nil {
		return nil, err
	}
	a.store = s
	return s, nil
}

func (a *Agent) localStatus(ctx context.Context, sp *etcdproc.Spec) (etcdproc.MemberStatus, error) {
	endpoint := sp.ClientURLs[0]
	if sp.Quarantined {
		endpoint = sp.QuarantineClientURLs[0]
	}
	if a.client == nil || a.clientEndpoint != endpoint {
		if a.client != nil {
			_ = a.client.Close()
		}
		c, err := etcdproc.NewClient([]string{endpoint})
		if err != nil {
			return etcdproc.MemberStatus{}, err
		}
		a.client, a.clientEndpoint = c, endpoint
	}
	return etcdproc.LocalStatus(ctx, a.client, endpoint)
}

func (a *Agent) execute(ctx context.Context, act Action) error {
	switch act := act.(type) {
	case StartEtcd:
		return a.startEtcd(ctx)
	case CreateCluster:
		return a.createCluster(ctx, act)
	case ConfirmCreate:
		return a.confirmCreate(ctx, act.Token)
	case MarkBootstrapped:
		return a.markBootstrapped()
	default:
		return fmt.Errorf("controller: unknown action %T", act)
	}
}

func (a *Agent) startEtcd(ctx context.Context) error {
	m := a.state.Member
	if m == nil {
		return errors.New("controller: this node is not a member")
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return fmt.Errorf("controller: local state: %w", err)
	}
	bins, err := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if err := bins.CheckVersion(ctx); err != nil {
		return err
	}
	if m.NewCluster && a.layout.HasEtcdData(m.ClusterToken) {
		if err := a.markBootstrapped(); err != nil {
			return err
		}
		m = a.state.Member
	}
	return a.proc.Start(ctx, a.etcdSpec(bins, m))
}

// markBootstrapped clears NewCluster once etcd has written its data: from
// then on a missing data dir means lost data, never a cluster to create
// again. The running etcd keeps running; later restarts use the new state.
func (a *Agent) markBootstrapped() error {
	st := a.state
	m := *st.Member
	m.NewCluster = false
	st.Member = &m
	if err := a.layout.SaveState(st); err != nil {
		return err
	}
	a.state = st
	if cur := a.proc.Status().Spec; cur != nil {
		a.proc.Update(a.etcdSpec(cur.Binaries, &m))
	}
	return nil
}

func (a *Agent) etcdSpec(bins etcdproc.Binaries, m *etcdproc.MemberState) etcdproc.Spec {
	return etcdproc.Spec{
		Binaries:             bins,
		Name:                 a.state.NodeID,
		DataDir:              a.layout.EtcdDataDir(m.ClusterToken),
		ClientURLs:           a.cfg.ClientURLs,
		QuarantineClientURLs: a.cfg.QuarantineClientURLs,
		Quarantined:          m.Quarantined,
		PeerURLs:             a.cfg.PeerURLs,
		InitialCluster:       m.InitialCluster,
		NewCluster:           m.NewCluster,
		ClusterToken:         m.ClusterToken,
	}
}

// createCluster begins a new cluster. The order makes a crash at any
// point safe: local state is written (pending) before the once-only
// creation marker, and etcd starts only after the marker names this
// node's token.
func (a *Agent) createCluster(ctx context.Context, act CreateCluster) error {
	if len(act.Members) != 1 || act.Members[0] != a.state.NodeID {
		return fmt.Errorf("controller: creating a cluster of %v needs the peer API, which this build does not have yet", act.Members)
	}
	v, err := spec.ParseSupportedVersion(act.Version)
	if err != nil {
		return err
	}
	bins, err := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if err := bins.CheckVersion(ctx); err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	st := a.state
	st.Member = &etcdproc.MemberState{
		ClusterToken:   token,
		EtcdVersion:    v.String(),
		InitialCluster: initialCluster(a.state.NodeID, a.cfg.PeerURLs),
		NewCluster:     true,
		Pending:        true,
	}
	if err := a.layout.SaveState(st); err != nil {
		return err
	}
	a.state = st
	a.log.Info("creating cluster", "cluster-token", token, "version", v.String(), "members", act.Members)
	return a.confirmCreate(ctx, token)
}

func (a *Agent) confirmCreate(ctx context.Context, token string) error {
	s, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	err = s.CreateCreated(ctx, spec.ClusterCreated{Timestamp: spec.Int64(a.now().UnixNano()), ClusterToken: token})
	if errors.Is(err, store.ErrExists) {
		c, rerr := s.ReadCreated(ctx)
		if rerr != nil {
			return fmt.Errorf("controller: read cluster-created marker: %w", rerr)
		}
		if c.ClusterToken != token {
			a.log.Warn("another agent created the cluster first; abandoning this creation", "cluster-token", token, "marker-token", c.ClusterToken)
			return a.abandonMember(token)
		}
		err = nil
	}
	if err != nil {
		return err
	}
	st := a.state
	m := *st.Member
	m.Pending = false
	st.Member = &m
	if err := a.layout.SaveState(st); err != nil {
		return err
	}
	a.state = st
	a.log.Info("cluster created", "cluster-token", token)
	return a.startEtcd(ctx)
}

// abandonMember drops this node's membership of the cluster with token,
// moving any data to the trash.
func (a *Agent) abandonMember(token string) error {
	if _, err := a.layout.Trash(token, a.now()); err != nil {
		return err
	}
	st := a.state
	st.Member = nil
	if err := a.layout.SaveState(st); err != nil {
		return err
	}
	a.state = st
	return nil
}

func initialCluster(name string, peerURLs []string) string {
	s := ""
	for i, u := range peerURLs {
		if i > 0 {
			s += ","
		}
		s += name + "=" + u
	}
	return s
}

func newToken() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("controller: cluster token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
