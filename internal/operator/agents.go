package operator

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// Engine is what the reconciles need of the engine: the agents' live
// status, and the store, which the agents read and write for the operator.
type Engine interface {
	// Status asks every member pod's agent for its report.
	Status(ctx context.Context, c *v1alpha1.EtcdCluster) (cli.ClusterStatus, error)
	Spec(ctx context.Context, c *v1alpha1.EtcdCluster) (operatorapi.SpecReply, error)
	WriteSpec(ctx context.Context, c *v1alpha1.EtcdCluster, req operatorapi.WriteSpecRequest) error
	Backups(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.BackupRow, error)
	Commands(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.CommandRow, error)
	BackupNow(ctx context.Context, c *v1alpha1.EtcdCluster) (string, error)
	RestoreBackup(ctx context.Context, c *v1alpha1.EtcdCluster, backup string) (string, error)
	// MoveLeader has the agent in pod, whose etcd leads, hand leadership
	// to the member of ID to.
	MoveLeader(ctx context.Context, c *v1alpha1.EtcdCluster, pod string, to uint64) error
}

// ErrNoAgent means no member pod's agent could be reached.
var ErrNoAgent = errors.New("operator: no member pod's agent answered")

// Call timeouts: one agent's report, and one store call through an
// agent. A call that times out goes to the next pod.
const (
	infoTimeout  = 3 * time.Second
	storeTimeout = 10 * time.Second
)

// Agents reaches a cluster's agents over their peer API, with mutual TLS
// and an operator certificate it issues itself from the cluster's CA
// Secret. It keeps a connection per agent, and a certificate per CA.
type Agents struct {
	// Client reads the member pods and the CA Secret.
	Client client.Client
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu    sync.Mutex
	creds map[types.NamespacedName]*operatorCreds
	conns map[string]*agentConn
	// next rotates the store calls among a cluster's agents, so that no
	// one pod takes them all.
	next map[types.NamespacedName]int
}

// operatorCreds are the TLS credentials of the operator for one cluster.
type operatorCreds struct {
	caSum   [sha256.Size]byte
	creds   credentials.TransportCredentials
	renewAt time.Time
	// readAt is when the CA Secret was read last: it is read again at most
	// every credsRecheck.
	readAt time.Time
	// gen tells connections made with other credentials apart.
	gen int
}

type agentConn struct {
	c        *peer.Client
	gen      int
	lastUsed time.Time
}

const (
	// operatorCertValidity is the life of the operator's certificates;
	// they are renewed with a third of it left.
	operatorCertValidity = 24 * time.Hour
	// credsRecheck is how often the CA Secret is read again for a change.
	credsRecheck = time.Minute
	// connIdle closes a connection unused this long (a pod gone).
	connIdle = 2 * time.Minute
)

var credsGen struct {
	sync.Mutex
	n int
}

func (a *Agents) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// OperatorCommonName is the common name of the operator's certificates.
const OperatorCommonName = "etcd-manager-operator"

// credentials returns the operator's credentials for c, issuing a
// certificate from its CA Secret when there is none, it is due for
// renewal, or the CA changed.
func (a *Agents) credentials(ctx context.Context, c *v1alpha1.EtcdCluster) (*operatorCreds, error) {
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
	now := a.now()
	a.mu.Lock()
	oc := a.creds[key]
	a.mu.Unlock()
	if oc != nil && now.Before(oc.renewAt) && now.Sub(oc.readAt) < credsRecheck {
		return oc, nil
	}
	var sec corev1.Secret
	if err := a.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: CASecretName(c)}, &sec); err != nil {
		return nil, fmt.Errorf("operator: the CA Secret %s: %w", CASecretName(c), err)
	}
	certPEM, keyPEM := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	sum := sha256.Sum256(append(append([]byte{}, certPEM...), keyPEM...))
	if oc != nil && oc.caSum == sum && now.Before(oc.renewAt) {
		a.mu.Lock()
		oc.readAt = now
		a.mu.Unlock()
		return oc, nil
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("operator: the CA Secret %s: %w", sec.Name, err)
	}
	crt, k, err := ca.Issue(pki.CertRequest{CommonName: OperatorCommonName, Role: pki.RoleOperator,
		DNSNames: []string{pki.OperatorMarker(c.Name)}, Validity: operatorCertValidity}, nil, now)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(crt, k)
	if err != nil {
		return nil, fmt.Errorf("operator: the operator certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("operator: the operator certificate: %w", err)
	}
	// The agents trust the CA's certificate, and so does the operator.
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	credsGen.Lock()
	credsGen.n++
	gen := credsGen.n
	credsGen.Unlock()
	oc = &operatorCreds{caSum: sum, creds: credentials.NewTLS(pki.AgentClientConfig(pair, pool, pki.NodeMarker(c.Name))),
		renewAt: pki.RenewAt(leaf), readAt: now, gen: gen}
	a.mu.Lock()
	if a.creds == nil {
		a.creds = map[types.NamespacedName]*operatorCreds{}
	}
	a.creds[key] = oc
	a.mu.Unlock()
	return oc, nil
}

// agentPod is a member pod whose agent can be called.
type agentPod struct {
	name, addr string
}

// agentPods are c's running member pods with an address, in ordinal
// order.
func (a *Agents) agentPods(ctx context.Context, c *v1alpha1.EtcdCluster) ([]agentPod, error) {
	var pods corev1.PodList
	if err := a.Client.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabels(selectorLabels(c))); err != nil {
		return nil, err
	}
	var out []agentPod
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || !agentRunning(&p) {
			continue
		}
		out = append(out, agentPod{name: p.Name, addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(agentPort(&p))))})
	}
	sort.Slice(out, func(i, j int) bool { return ordinalLess(out[i].name, out[j].name) })
	return out, nil
}

// agentRunning says whether the pod's agent container runs.
func agentRunning(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container && cs.State.Running != nil {
			return true
		}
	}
	return false
}

// agentPort is the pod's container port named "agent", the peer API's.
func agentPort(p *corev1.Pod) int32 {
	for _, ctr := range p.Spec.Containers {
		for _, port := range ctr.Ports {
			if port.Name == "agent" && port.ContainerPort > 0 {
				return port.ContainerPort
			}
		}
	}
	return AgentPort
}

// client returns the connection to the agent at addr with oc.
func (a *Agents) client(addr, cluster string, oc *operatorCreds) (*peer.Client, error) {
	key := cluster + "@" + addr
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns == nil {
		a.conns = map[string]*agentConn{}
	}
	for k, ac := range a.conns {
		if now.Sub(ac.lastUsed) > connIdle && k != key {
			_ = ac.c.Close()
			delete(a.conns, k)
		}
	}
	if ac := a.conns[key]; ac != nil {
		if ac.gen == oc.gen {
			ac.lastUsed = now
			return ac.c, nil
		}
		_ = ac.c.Close()
		delete(a.conns, key)
	}
	pc, err := peer.Dial(addr, cluster, oc.creds)
	if err != nil {
		return nil, err
	}
	a.conns[key] = &agentConn{c: pc, gen: oc.gen, lastUsed: now}
	return pc, nil
}

// Status asks every member pod's agent for its report, at once.
func (a *Agents) Status(ctx context.Context, c *v1alpha1.EtcdCluster) (cli.ClusterStatus, error) {
	var st cli.ClusterStatus
	oc, err := a.credentials(ctx, c)
	if err != nil {
		return st, err
	}
	pods, err := a.agentPods(ctx, c)
	if err != nil {
		return st, err
	}
	if len(pods) == 0 {
		return st, fmt.Errorf("%w: no member pod is running", ErrNoAgent)
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for _, p := range pods {
		wg.Go(func() {
			info, err := a.info(ctx, p, c.Name, oc)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st.Unreachable = append(st.Unreachable, p.addr)
				errs = append(errs, fmt.Errorf("pod %s: %w", p.name, err))
				return
			}
			st.Add(p.addr, info)
		})
	}
	wg.Wait()
	if len(st.Agents) == 0 {
		return st, fmt.Errorf("%w: %w", ErrNoAgent, errors.Join(errs...))
	}
	sort.Slice(st.Agents, func(i, j int) bool { return ordinalLess(st.Agents[i].ID, st.Agents[j].ID) })
	slices.Sort(st.Unreachable)
	return st, nil
}

func (a *Agents) info(ctx context.Context, p agentPod, cluster string, oc *operatorCreds) (peer.NodeInfo, error) {
	pc, err := a.client(p.addr, cluster, oc)
	if err != nil {
		return peer.NodeInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	return pc.Info(ctx)
}

// call makes a store call through one agent, trying the next pod when an
// agent cannot be reached, never when one answered with a refusal. Each
// cluster's calls start at another pod each time.
func (a *Agents) call(ctx context.Context, c *v1alpha1.EtcdCluster, fn func(context.Context, *operatorapi.Client) error) error {
	oc, err := a.credentials(ctx, c)
	if err != nil {
		return err
	}
	pods, err := a.agentPods(ctx, c)
	if err != nil {
		return err
	}
	if len(pods) == 0 {
		return fmt.Errorf("%w: no member pod is running", ErrNoAgent)
	}
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
	a.mu.Lock()
	if a.next == nil {
		a.next = map[types.NamespacedName]int{}
	}
	start := a.next[key] % len(pods)
	a.next[key]++
	a.mu.Unlock()
	var errs []error
	for i := range pods {
		p := pods[(start+i)%len(pods)]
		pc, err := a.client(p.addr, c.Name, oc)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, storeTimeout)
			err = fn(cctx, operatorapi.NewClient(pc.Conn(), p.name, c.Name))
			cancel()
		}
		if err == nil || errors.Is(err, operatorapi.ErrRefused) || errors.Is(err, operatorapi.ErrStoreInUse) || errors.Is(err, operatorapi.ErrNotNow) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%w: %w", ErrNoAgent, errors.Join(errs...))
}

// Spec reads the store's spec and owner.
func (a *Agents) Spec(ctx context.Context, c *v1alpha1.EtcdCluster) (operatorapi.SpecReply, error) {
	var rep operatorapi.SpecReply
	err := a.call(ctx, c, func(ctx context.Context, oc *operatorapi.Client) (err error) {
		rep, err = oc.Spec(ctx)
		return err
	})
	return rep, err
}

// WriteSpec writes the store's spec.
func (a *Agents) WriteSpec(ctx context.Context, c *v1alpha1.EtcdCluster, req operatorapi.WriteSpecRequest) error {
	return a.call(ctx, c, func(ctx context.Context, oc *operatorapi.Client) error { return oc.WriteSpec(ctx, req) })
}

// Backups lists the store's backups, oldest first.
func (a *Agents) Backups(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.BackupRow, error) {
	var rows []cli.BackupRow
	err := a.call(ctx, c, func(ctx context.Context, oc *operatorapi.Client) (err error) {
		rows, err = oc.Backups(ctx)
		return err
	})
	return rows, err
}

// Commands lists the store's command queue.
func (a *Agents) Commands(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.CommandRow, error) {
	var rows []cli.CommandRow
	err := a.call(ctx, c, func(ctx context.Context, oc *operatorapi.Client) (err error) {
		rows, err = oc.Commands(ctx)
		return err
	})
	return rows, err
}

// BackupNow queues a backup-now command and returns its ID. A call that
// timed out may have queued it all the same; the caller finds it in the
// queue (see queuedSince).
func (a *Agents) BackupNow(ctx context.Context, c *v1alpha1.EtcdCluster) (string, error) {
	return a.queue(ctx, c, operatorapi.QueueRequest{BackupNow: true})
}

// RestoreBackup queues a restore of the named backup, which the agent
// checks first, and returns the command's ID.
func (a *Agents) RestoreBackup(ctx context.Context, c *v1alpha1.EtcdCluster, backup string) (string, error) {
	return a.queue(ctx, c, operatorapi.QueueRequest{RestoreBackup: backup})
}

// queue queues a command through one agent only: a command is never
// queued twice because an agent answered late.
func (a *Agents) queue(ctx context.Context, c *v1alpha1.EtcdCluster, req operatorapi.QueueRequest) (string, error) {
	var id string
	err := a.call(ctx, c, func(ctx context.Context, oc *operatorapi.Client) (err error) {
		id, err = oc.Queue(ctx, req)
		if err != nil && ctx.Err() != nil {
			// It may have been queued: do not try another agent.
			return fmt.Errorf("%w: %w", operatorapi.ErrNotNow, err)
		}
		return err
	})
	return id, err
}

// MoveLeader has the agent in pod hand its etcd's leadership to to.
func (a *Agents) MoveLeader(ctx context.Context, c *v1alpha1.EtcdCluster, pod string, to uint64) error {
	oc, err := a.credentials(ctx, c)
	if err != nil {
		return err
	}
	pods, err := a.agentPods(ctx, c)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(pods, func(p agentPod) bool { return p.name == pod })
	if i < 0 {
		return fmt.Errorf("%w: pod %s does not run", ErrNoAgent, pod)
	}
	pc, err := a.client(pods[i].addr, c.Name, oc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	return operatorapi.NewClient(pc.Conn(), pod, c.Name).MoveLeader(ctx, to)
}

// ErrInvalidSpec means the store's cluster spec is invalid: the agents
// ignore it. The operator reports it (condition Degraded, reason
// StoreSpecInvalid) rather than replace it and lose the fields it does
// not own.
var ErrInvalidSpec = errors.New("operator: the store's cluster spec is invalid")
