package peer

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Errors returned by handlers, carried to callers as status messages.
var (
	ErrWrongCluster = errors.New("peer: request is for another cluster")
	ErrBusy         = errors.New("peer: node already belongs to another cluster")
	// ErrStaleTerm means a procedure's call came under a fencing term
	// older than one the node already obeyed: another driver took over.
	ErrStaleTerm = errors.New("peer: call from a driver whose term has passed")
)

// NodeInfo is what an agent reports about itself.
type NodeInfo struct {
	// Transfer is the node's long transfer in progress, such as a
	// restore's download of its backup; nil when none.
	Transfer    *spec.Transfer `json:"transfer,omitempty"`
	NodeID      string         `json:"nodeId"`
	ClusterName string         `json:"clusterName"`
	// PeerAddress is the agent's own peer API address (host:port).
	PeerAddress          string   `json:"peerAddress"`
	ClientURLs           []string `json:"clientURLs"`
	QuarantineClientURLs []string `json:"quarantineClientURLs"`
	PeerURLs             []string `json:"peerURLs"`
	// Member is the node's etcd membership from its local state.
	Member *etcdproc.MemberState `json:"member,omitempty"`
	// HasData is true when etcd's data for Member's token is on disk.
	HasData bool `json:"hasData"`
	// DataLost is true when etcd has run on Member's data and the data is
	// gone: the member must be replaced by a new one.
	DataLost bool `json:"dataLost,omitempty"`
	// PendingFor is how long a pending creation has waited for the store's
	// creation marker.
	PendingFor time.Duration `json:"pendingFor,omitempty"`
	// EtcdWanted is true while the agent keeps etcd running.
	EtcdWanted bool `json:"etcdWanted"`
	// AgentVersion is the agent's own build (version.Info.Short).
	AgentVersion string `json:"agentVersion,omitempty"`
	// EtcdHealthy is true when the local etcd answered a status call.
	EtcdHealthy bool   `json:"etcdHealthy"`
	EtcdVersion string `json:"etcdVersion,omitempty"`
	MemberID    uint64 `json:"memberId,omitempty"`
	ClusterID   uint64 `json:"clusterId,omitempty"`
	RaftLeader  uint64 `json:"raftLeader,omitempty"`
	RaftIndex   uint64 `json:"raftIndex,omitempty"`
	// SnapIndex is the raft index of etcd's newest raft snapshot on disk.
	SnapIndex uint64 `json:"snapIndex,omitempty"`
	// Revision is the etcd revision its etcd has applied or, while its
	// etcd does not serve, that of its data when etcd last started.
	Revision int64 `json:"revision,omitempty"`
	// StorageVersion is its etcd's data schema version (3.6 and later).
	StorageVersion string `json:"storageVersion,omitempty"`
	// DowngradeTarget is the cluster downgrade in progress, as its etcd
	// reports it.
	DowngradeTarget string `json:"downgradeTarget,omitempty"`
	IsLearner       bool   `json:"isLearner,omitempty"`
	DBSize          int64  `json:"dbSize,omitempty"`
	// Leader is true when this agent acts as the manager leader.
	Leader bool `json:"leader"`
	// Installed are the etcd versions installed on this node.
	Installed []string `json:"installed,omitempty"`
	// BackupKeys are the IDs (not the keys) of the encryption keys the
	// agent holds for backups and captured segments.
	BackupKeys []string `json:"backupKeys,omitempty"`
	// Failing are the leader's cluster changes that keep failing, each as
	// "action: last error"; they back off while the rest goes on.
	Failing []string `json:"failing,omitempty"`
	// Warnings are the leader's lines about states a person should know
	// of, such as a stalled peer URL switch, as its last plan reported
	// them.
	Warnings []string `json:"warnings,omitempty"`
	// Maintenance is the leader's record of its maintenance work.
	Maintenance *Maintenance `json:"maintenance,omitempty"`
	// LocalMembers are the members its etcd knows, from its own copy of
	// the membership (a read that needs no quorum).
	LocalMembers []MemberRef `json:"localMembers,omitempty"`
	// Now is the agent's clock when it answered: the caller estimates the
	// offset between their clocks from it.
	Now time.Time `json:"now,omitzero"`
	// MaxClockOffset is the largest clock offset the agent measured to a
	// peer in its last cycle.
	MaxClockOffset time.Duration `json:"maxClockOffset,omitempty"`
	// LockRefused says why the agent will not take the store lock, if it
	// will not (the store or the clocks cannot be trusted).
	LockRefused string `json:"lockRefused,omitempty"`
	// Procedure is the procedure this agent drives, as the store lock's
	// holder, and its phase: "restore-backup restoring", say.
	Procedure string `json:"procedure,omitempty"`
	// ObeyedTerm is the highest fencing term the node has obeyed: the
	// store lock takes its terms above it.
	ObeyedTerm int64 `json:"obeyedTerm,omitempty"`
	// NoLeaderFor is how long the node's etcd, a member, has seen no raft
	// leader without a break; 0 while it sees one.
	NoLeaderFor time.Duration `json:"noLeaderFor,omitempty"`
	// CertMarker is the node marker (pki.NodeMarker) that the node
	// certificate its etcd uses carries; empty without TLS for etcd.
	// Agents older than the marker report none. PeerCertCheckOff is set
	// when the agent asks for its cluster's etcd to take any peer
	// certificate from the CA (--etcd-peer-cert-check=false).
	CertMarker       string `json:"certMarker,omitempty"`
	PeerCertCheckOff bool   `json:"peerCertCheckOff,omitempty"`
	// Cert is the node certificate the agent uses, nil without TLS.
	Cert *CertInfo `json:"cert,omitempty"`
	// Trust are the SHA-256 fingerprints of the CAs the agent trusts
	// (its ca.crt), and EtcdTrust those its etcd was started with, which
	// it keeps until it restarts; both nil without TLS. CAFromDir is set
	// when the agent takes its CA from --pki-dir, not the store.
	Trust     []string `json:"trust,omitempty"`
	EtcdTrust []string `json:"etcdTrust,omitempty"`
	CAFromDir bool     `json:"caFromDir,omitempty"`
	// RestoreRoom is the largest snapshot the agent would unpack for a
	// restore now: its data dir's free space less the reserve, or its
	// --max-snapshot-bytes when smaller; 0 when unknown.
	RestoreRoom int64 `json:"restoreRoom,omitempty"`
	// HeldBy is the term of the procedure's driver that holds the node's
	// etcd down (see FenceRequest.Hold); 0 when none does.
	HeldBy int64 `json:"heldBy,omitempty"`
	// DataIndex is the raft index its data is applied to, read from the
	// database while etcd is held down; 0 when unknown. Revision and
	// LocalMembers then come from the database too.
	DataIndex uint64 `json:"dataIndex,omitempty"`
	// InitialCheckFailed is what its etcd said when its initial
	// corruption check failed: its data differs from a peer's, and its
	// agent keeps etcd stopped until the leader judges which is right.
	InitialCheckFailed string `json:"initialCheckFailed,omitempty"`
	// Unjudged is set while the member runs after it started without its
	// initial check, which failed with no leader to judge it: the leader
	// compares every member's data.
	Unjudged bool `json:"unjudged,omitempty"`
}

// CertInfo is a node's certificate and the CA that issued it.
type CertInfo struct {
	NotAfter time.Time `json:"notAfter"`
	// CA names the CA: its common name and the start of its SHA-256
	// fingerprint, as openssl prints it.
	CA         string    `json:"ca"`
	CANotAfter time.Time `json:"caNotAfter"`
	// CAFingerprint is the issuing CA's whole SHA-256 fingerprint.
	CAFingerprint string `json:"caFingerprint,omitempty"`
}

// MemberRef names an etcd member: its name (the node ID) and peer URLs.
type MemberRef struct {
	Name      string   `json:"name"`
	PeerURLs  []string `json:"peerURLs,omitempty"`
	IsLearner bool     `json:"isLearner,omitempty"`
}

// InfoRequest asks an agent for its NodeInfo.
type InfoRequest struct {
	ClusterName string `json:"clusterName"`
	// Changed says the caller's own state changed since its last call
	// (it started, or its etcd joined or left), or, from
	// etcd-manager-ctl, that it changed the store (queued a command, set
	// the spec): the receiver's agent looks at the cluster again at once
	// instead of on its next tick.
	Changed bool `json:"changed,omitempty"`
}

// JoinRequest tells a node to become an etcd member.
type JoinRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	// Member is the membership to adopt. With Pending set, the node waits
	// for the store's creation marker before it starts etcd.
	Member etcdproc.MemberState `json:"member"`
}

// LeaveRequest tells a node to stop being a member of the cluster with
// Token: it stops etcd and moves the data to its trash.
type LeaveRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	Reason      string `json:"reason"`
	// Term is the fencing term of the procedure's driver (the store
	// lock's), 0 outside a procedure. A node refuses a term older than one
	// it has obeyed.
	Term int64 `json:"term,omitempty"`
	// Replaced says the whole cluster is being replaced (a restore):
	// etcd gets a short grace to stop before it is killed, instead of
	// waiting on clients' requests that it can no longer answer. An
	// older node ignores it and stops etcd gracefully.
	Replaced bool `json:"replaced,omitempty"`
	// NotAfter is when the driver's lease runs out (see CheckNotAfter).
	NotAfter time.Time `json:"notAfter,omitzero"`
}

// RestoreRequest tells a node to become a member of a new cluster made
// from a backup: it stops any etcd it runs (moving that data to the
// trash), fetches and checks the backup itself, restores it into the
// new cluster's data dir and starts etcd with Member (quarantined).
type RestoreRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Backup      string `json:"backup"`
	// Point takes the backup forward to a revision, with captured
	// segments.
	Point  spec.RestorePoint    `json:"point,omitzero"`
	Member etcdproc.MemberState `json:"member"`
	// Term is the fencing term of the procedure's driver (the store
	// lock's), 0 outside a procedure. A node refuses a term older than one
	// it has obeyed.
	Term int64 `json:"term,omitempty"`
	// NotAfter is when the driver's lease runs out (see CheckNotAfter).
	NotAfter time.Time `json:"notAfter,omitzero"`
}

// QuarantineRequest sets whether the node's etcd, a member of the cluster
// with Token, serves clients on the quarantine URLs only.
type QuarantineRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	Quarantined bool   `json:"quarantined"`
	// Term is the fencing term of the procedure's driver (the store
	// lock's), 0 outside a procedure. A node refuses a term older than one
	// it has obeyed.
	Term int64 `json:"term,omitempty"`
	// NotAfter is when the driver's lease runs out (see CheckNotAfter).
	NotAfter time.Time `json:"notAfter,omitzero"`
}

// RecoverRequest tells a member of the cluster with Token that lost
// quorum to restart etcd with --force-new-cluster: the cluster continues
// from this member's data alone.
type RecoverRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	// Term is the fencing term of the procedure's driver (the store
	// lock's), 0 outside a procedure. A node refuses a term older than one
	// it has obeyed.
	Term int64 `json:"term,omitempty"`
	// NotAfter is when the driver's lease runs out, by its clock: a node
	// refuses the call later than that (see CheckNotAfter).
	NotAfter time.Time `json:"notAfter,omitzero"`
}

// RecoverWait bounds how long a node's Recover waits for its etcd,
// restarted with --force-new-cluster, to lead; a caller's timeout must
// be longer.
const RecoverWait = time.Minute

// VersionRequest tells a member of the cluster with Token to run etcd of
// Version on its data: it restarts etcd with that binary.
type VersionRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	Version     string `json:"version"`
}

// SettingsRequest tells a member of the cluster with Token to run etcd
// with Settings (the spec's etcd settings): it restarts etcd with them.
type SettingsRequest struct {
	ClusterName string            `json:"clusterName"`
	LeaderID    string            `json:"leaderId"`
	Token       string            `json:"token"`
	Settings    map[string]string `json:"settings"`
}

// DiscardRequest tells a member's agent that its etcd's data disagrees
// with the majority of its peers': stop etcd and set the data aside, so
// that the leader rebuilds the member from its peers. MemberID guards
// against a request meant for an earlier member of the node.
type DiscardRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	MemberID    uint64 `json:"memberId"`
	Reason      string `json:"reason"`
}

// HashDataRequest asks a member's agent, whose etcd does not run, for the
// HashKV of its data at Revision (0: its newest), read from its database:
// the leader judges a member that cannot serve (its initial corruption
// check failed, say) by the majority's hash, as the others by theirs.
type HashDataRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	Revision    int64  `json:"revision"`
}

// DataHash is a member's HashKV read from its database.
type DataHash struct {
	Hash            uint32 `json:"hash"`
	CompactRevision int64  `json:"compactRevision"`
	Revision        int64  `json:"revision"`
	CurrentRevision int64  `json:"currentRevision"`
}

// ResumeRequest tells a member's agent whose etcd refused to start, its
// initial corruption check failed, that the leader found its data agrees
// with the majority's: it starts etcd once without that check (the check
// compared it with a damaged peer).
type ResumeRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	MemberID    uint64 `json:"memberId"`
	Reason      string `json:"reason"`
}

// DefragRequest tells a member's agent to defragment its etcd with its
// clients held off: etcd restarts serving only its quarantine client
// URLs, is defragmented there, and restarts on its usual URLs. Its
// clients go to the other members meanwhile, where they would stall on a
// member defragmenting in their sight. MemberID guards against a request
// meant for an earlier member of the node; InUseBytes (the member's
// database in use, as etcd last reported it) is the space etcd's compact
// copy needs.
type DefragRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	MemberID    uint64 `json:"memberId"`
	InUseBytes  int64  `json:"inUseBytes"`
}

// DefragResult is what a defragmentation did: the database's size before
// and after (0 when etcd did not say), and how long the member's clients
// were held off.
type DefragResult struct {
	SizeBefore int64         `json:"sizeBefore"`
	SizeAfter  int64         `json:"sizeAfter"`
	Took       time.Duration `json:"tookNanos"`
}

// PeerURLsRequest tells a member's agent that its etcd is now registered
// with URLs, its own configured peer URLs, and should serve them.
type PeerURLsRequest struct {
	ClusterName string   `json:"clusterName"`
	LeaderID    string   `json:"leaderId"`
	Token       string   `json:"token"`
	URLs        []string `json:"urls"`
}

// PeerCertCheckRequest tells a member's agent to restart its etcd
// requiring Hostname of peer certificates (--peer-cert-allowed-hostname),
// or, with Hostname empty, taking any certificate from the CA.
type PeerCertCheckRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Token       string `json:"token"`
	Hostname    string `json:"hostname"`
}

// CARequest tells a node to read the CA and the CAs to trust from the
// store again (a CA rotation), and to write them to its files, with a
// new key and certificate when the issuing CA changed. Trust and Issuer
// are the SHA-256 fingerprints the leader read: a node that reads
// otherwise refuses, and is asked again. With RestartEtcd, a member of
// the cluster with Token whose etcd runs with other CAs than its file
// holds now restarts it (etcd reads them only when it starts).
type CARequest struct {
	ClusterName string   `json:"clusterName"`
	LeaderID    string   `json:"leaderId"`
	Token       string   `json:"token"`
	Trust       []string `json:"trust"`
	Issuer      string   `json:"issuer"`
	RestartEtcd bool     `json:"restartEtcd,omitempty"`
}

// FenceRequest tells a node that a procedure's driver of Term has taken
// over: from now on it refuses calls of older terms. It changes nothing
// else.
type FenceRequest struct {
	ClusterName string `json:"clusterName"`
	LeaderID    string `json:"leaderId"`
	Term        int64  `json:"term"`
	// Hold has the node stop its etcd and keep it stopped, until Release
	// or HoldFor passes (a driver that went away), and report its data's
	// position read from its database: what recover-quorum does to every
	// data holder before it forces one. A frozen etcd that thaws finds
	// its agent holding it down.
	Hold bool `json:"hold,omitempty"`
	// Release ends a hold of this term or an older one.
	Release bool `json:"release,omitempty"`
	// NotAfter is when the driver's lease runs out (see CheckNotAfter).
	NotAfter time.Time `json:"notAfter,omitzero"`
}

// HoldFor bounds a hold a driver stopped renewing (it renews it every
// cycle while it plans): etcd may start again once it passes.
const HoldFor = 10 * time.Minute

// ErrLeaseOver means a procedure's call came after the driver's lease
// ran out by the node's clock: the driver may have been paused, and
// another may have acted since.
var ErrLeaseOver = errors.New("peer: call after its driver's lease ran out")

// CheckNotAfter refuses a call whose NotAfter is past at now; a zero one
// (from an agent older than it) passes.
func CheckNotAfter(notAfter, now time.Time, what string) error {
	if !notAfter.IsZero() && now.After(notAfter) {
		return fmt.Errorf("%w: %s was due by %s, and it is %s here", ErrLeaseOver, what, notAfter.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// Maintenance is the leader's record of its maintenance work since it
// began to lead, and the alarms etcd has raised.
type Maintenance struct {
	LastDefrag    *DefragRecord    `json:"lastDefrag,omitempty"`
	LastHashCheck *HashCheckRecord `json:"lastHashCheck,omitempty"`
	// LastDiscard is the last member whose data disagreed with the
	// majority's, set aside to be rebuilt from its peers.
	LastDiscard *DiscardRecord `json:"lastDiscard,omitempty"`
	// Alarms are etcd's raised alarms, "NOSPACE <member ID>".
	Alarms []string `json:"alarms,omitempty"`
}

// DefragRecord is one member's defragmentation.
type DefragRecord struct {
	Node     string        `json:"node"`
	At       time.Time     `json:"at"`
	Duration time.Duration `json:"durationNanos"`
	// SizeBefore and SizeAfter are the member's database sizes, 0 when
	// it did not answer.
	SizeBefore int64 `json:"sizeBefore,omitempty"`
	SizeAfter  int64 `json:"sizeAfter,omitempty"`
	// Isolated is set when the member's clients were held off for it.
	Isolated bool `json:"isolated,omitempty"`
}

// HashCheckRecord is one comparison of the voting members' HashKV.
type HashCheckRecord struct {
	At       time.Time `json:"at"`
	Revision int64     `json:"revision"`
	// Outcome is agree or mismatch.
	Outcome string `json:"outcome"`
}

// DiscardRecord is a member's data set aside for disagreeing.
type DiscardRecord struct {
	Node   string    `json:"node"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// Empty is an empty reply.
type Empty struct{}

// Handler is what the server needs from the agent. Calls come on gRPC
// goroutines, concurrently with the agent's own loop.
type Handler interface {
	Info(ctx context.Context) (NodeInfo, error)
	Join(ctx context.Context, req JoinRequest) error
	Leave(ctx context.Context, req LeaveRequest) error
	Restore(ctx context.Context, req RestoreRequest) error
	Quarantine(ctx context.Context, req QuarantineRequest) error
	Recover(ctx context.Context, req RecoverRequest) error
	SetVersion(ctx context.Context, req VersionRequest) error
	SetSettings(ctx context.Context, req SettingsRequest) error
	DiscardData(ctx context.Context, req DiscardRequest) error
	HashData(ctx context.Context, req HashDataRequest) (DataHash, error)
	Resume(ctx context.Context, req ResumeRequest) error
	Defrag(ctx context.Context, req DefragRequest) (DefragResult, error)
	SetPeerURLs(ctx context.Context, req PeerURLsRequest) error
	SetPeerCertCheck(ctx context.Context, req PeerCertCheckRequest) error
	SyncCA(ctx context.Context, req CARequest) error
	Fence(ctx context.Context, req FenceRequest) error
}

const serviceName = "etcdmanager.peer.v1.Peer"

// codec carries the messages above as JSON.
type codec struct{}

func (codec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (codec) Name() string                       { return CodecName }

// CodecName is the content subtype of the messages' JSON codec: other
// services on the peer API's server (see Server.RegisterService) call with
// it.
const CodecName = "json"

func init() { encoding.RegisterCodec(codec{}) }

// TransportCredentials secure the peer API's connections.
type TransportCredentials = credentials.TransportCredentials

// InsecureCredentials are plaintext, for --insecure.
func InsecureCredentials() credentials.TransportCredentials { return insecure.NewCredentials() }

// Server serves the peer API.
type Server struct {
	grpc        *grpc.Server
	clusterName string
	h           Handler
	// unmarkedUntil is when node certificates without a node marker
	// stop passing (see AcceptUnmarkedUntil); now reads the clock.
	unmarkedUntil time.Time
	now           func() time.Time
	// onChange, when set, is told of a caller whose state changed.
	onChange func(host string)
	// revoked refuses the certificates of revoked nodes, every call
	// theirs (see RefuseRevoked).
	revoked *pki.RevocationSet
	// storeMarker, when set, is the store marker this cluster's node
	// certificates carry (see BindToStore).
	storeMarker string
}

// BindToStore makes the server take a node's calls only from a
// certificate that carries marker, this cluster's pki.StoreMarker, as
// well as its node marker, and refuse every call, Info included, from
// one that carries another store's: a node of another cluster of the
// same name on the same CA. A node certificate without any store marker
// (from an etcd-manager before them) passes as one without a node
// marker does (see AcceptUnmarkedUntil). Set it before Serve.
func (s *Server) BindToStore(marker string) { s.storeMarker = marker }

// RefuseRevoked makes the server refuse every call, Info included, that
// comes with a certificate set refuses: a revoked node's. Set it before
// Serve; the set's list may change at any time.
func (s *Server) RefuseRevoked(set *pki.RevocationSet) { s.revoked = set }

// AcceptUnmarkedUntil lets node certificates that carry no node marker
// at all, issued before markers existed, make a node's calls until t
// (see authorize). Set it before Serve.
func (s *Server) AcceptUnmarkedUntil(t time.Time) { s.unmarkedUntil = t }

// OnPeerChange sets f to be called, on a gRPC goroutine, when a peer
// says its state changed (see InfoRequest.Changed), with the host (IP)
// the call came from, or "" if gRPC does not say. Set it before Serve.
func (s *Server) OnPeerChange(f func(host string)) { s.onChange = f }

// callerHost is the IP a call came from, or "".
func callerHost(ctx context.Context) string {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return ""
	}
	return host
}

// NewServer returns a server for h, which checks that requests name
// clusterName.
func NewServer(creds credentials.TransportCredentials, clusterName string, h Handler) *Server {
	s := &Server{grpc: grpc.NewServer(append(serverLimits(), grpc.Creds(creds))...), clusterName: clusterName, h: h, now: time.Now}
	s.grpc.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Info", Handler: unary(s, func(ctx context.Context, r *InfoRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				if r.Changed && s.onChange != nil {
					s.onChange(callerHost(ctx))
				}
				info, err := s.h.Info(ctx)
				return &info, err
			})},
			{MethodName: "Join", Handler: unary(s, func(ctx context.Context, r *JoinRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Join(ctx, *r)
			})},
			{MethodName: "Leave", Handler: unary(s, func(ctx context.Context, r *LeaveRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Leave(ctx, *r)
			})},
			{MethodName: "Restore", Handler: unary(s, func(ctx context.Context, r *RestoreRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Restore(ctx, *r)
			})},
			{MethodName: "Quarantine", Handler: unary(s, func(ctx context.Context, r *QuarantineRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Quarantine(ctx, *r)
			})},
			{MethodName: "Recover", Handler: unary(s, func(ctx context.Context, r *RecoverRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Recover(ctx, *r)
			})},
			{MethodName: "SetVersion", Handler: unary(s, func(ctx context.Context, r *VersionRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.SetVersion(ctx, *r)
			})},
			{MethodName: "SetSettings", Handler: unary(s, func(ctx context.Context, r *SettingsRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.SetSettings(ctx, *r)
			})},
			{MethodName: "DiscardData", Handler: unary(s, func(ctx context.Context, r *DiscardRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.DiscardData(ctx, *r)
			})},
			{MethodName: "HashData", Handler: unary(s, func(ctx context.Context, r *HashDataRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				res, err := s.h.HashData(ctx, *r)
				return &res, err
			})},
			{MethodName: "Resume", Handler: unary(s, func(ctx context.Context, r *ResumeRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Resume(ctx, *r)
			})},
			{MethodName: "Defrag", Handler: unary(s, func(ctx context.Context, r *DefragRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				res, err := s.h.Defrag(ctx, *r)
				return &res, err
			})},
			{MethodName: "SetPeerURLs", Handler: unary(s, func(ctx context.Context, r *PeerURLsRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.SetPeerURLs(ctx, *r)
			})},
			{MethodName: "SetPeerCertCheck", Handler: unary(s, func(ctx context.Context, r *PeerCertCheckRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.SetPeerCertCheck(ctx, *r)
			})},
			{MethodName: "SyncCA", Handler: unary(s, func(ctx context.Context, r *CARequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.SyncCA(ctx, *r)
			})},
			{MethodName: "Fence", Handler: unary(s, func(ctx context.Context, r *FenceRequest) (any, error) {
				if err := s.checkCluster(r.ClusterName); err != nil {
					return nil, err
				}
				return &Empty{}, s.h.Fence(ctx, *r)
			})},
		},
	}, s)
	return s
}

// A tokenRequest acts on the cluster with its token.
type tokenRequest interface{ clusterToken() string }

func (r *JoinRequest) clusterToken() string          { return r.Member.ClusterToken }
func (r *LeaveRequest) clusterToken() string         { return r.Token }
func (r *RestoreRequest) clusterToken() string       { return r.Member.ClusterToken }
func (r *QuarantineRequest) clusterToken() string    { return r.Token }
func (r *RecoverRequest) clusterToken() string       { return r.Token }
func (r *VersionRequest) clusterToken() string       { return r.Token }
func (r *SettingsRequest) clusterToken() string      { return r.Token }
func (r *DiscardRequest) clusterToken() string       { return r.Token }
func (r *HashDataRequest) clusterToken() string      { return r.Token }
func (r *ResumeRequest) clusterToken() string        { return r.Token }
func (r *DefragRequest) clusterToken() string        { return r.Token }
func (r *PeerURLsRequest) clusterToken() string      { return r.Token }
func (r *PeerCertCheckRequest) clusterToken() string { return r.Token }
func (r *CARequest) clusterToken() string            { return r.Token }

func (s *Server) checkCluster(name string) error {
	if name != s.clusterName {
		return fmt.Errorf("%w: this agent serves cluster %q, not %q", ErrWrongCluster, s.clusterName, name)
	}
	return nil
}

func unary[Req any](s *Server, fn func(context.Context, *Req) (any, error)) grpc.MethodHandler {
	return func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		if err := s.authorize(ctx, req); err != nil {
			return nil, err
		}
		if r, ok := any(req).(tokenRequest); ok {
			// The token names the node's data folders.
			if err := spec.CheckClusterToken("the request's cluster token", r.clusterToken()); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
		}
		return fn(ctx, req)
	}
}

// A leaderRequest names the node that makes it.
type leaderRequest interface{ leader() string }

func (r *JoinRequest) leader() string          { return r.LeaderID }
func (r *LeaveRequest) leader() string         { return r.LeaderID }
func (r *RestoreRequest) leader() string       { return r.LeaderID }
func (r *QuarantineRequest) leader() string    { return r.LeaderID }
func (r *RecoverRequest) leader() string       { return r.LeaderID }
func (r *VersionRequest) leader() string       { return r.LeaderID }
func (r *SettingsRequest) leader() string      { return r.LeaderID }
func (r *DiscardRequest) leader() string       { return r.LeaderID }
func (r *HashDataRequest) leader() string      { return r.LeaderID }
func (r *ResumeRequest) leader() string        { return r.LeaderID }
func (r *DefragRequest) leader() string        { return r.LeaderID }
func (r *PeerURLsRequest) leader() string      { return r.LeaderID }
func (r *PeerCertCheckRequest) leader() string { return r.LeaderID }
func (r *CARequest) leader() string            { return r.LeaderID }
func (r *FenceRequest) leader() string         { return r.LeaderID }

// authorize lets a caller over TLS act on a node only with a node
// certificate of this cluster: one that carries this cluster's node
// marker (pki.NodeMarker), under the name of the node the request says
// makes it. Until AcceptUnmarkedUntil's time, a node certificate with no
// node marker at all (issued before markers) passes too, under the same
// name check. Info may be read with any certificate the handshake
// verified (a person's, or the ctl's), but another cluster's node or
// operator certificate, from a shared CA. The certificate itself was
// verified in the handshake.
func (s *Server) authorize(ctx context.Context, req any) error {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil // plaintext: --insecure
	}
	var c *x509.Certificate
	if certs := info.State.PeerCertificates; len(certs) > 0 {
		c = certs[0]
	}
	if c != nil {
		if err := s.revoked.Refuses(c); err != nil {
			return status.Errorf(codes.PermissionDenied, "peer: %v", err)
		}
	}
	if _, readOnly := req.(*InfoRequest); readOnly {
		if c != nil {
			if other := s.foreign(c); other != "" {
				return status.Errorf(codes.PermissionDenied, "peer: %q is a certificate of another cluster (%s); this agent serves cluster %q", c.Subject.CommonName, other, s.clusterName)
			}
		}
		return nil
	}
	if c == nil || pki.PeerRole(c) != pki.RoleNode {
		name := ""
		if c != nil {
			name = c.Subject.CommonName
		}
		return status.Errorf(codes.PermissionDenied, "peer: %q is not a node certificate; only agents may change a node, other certificates may read its status", name)
	}
	nodeMarked := pki.CarriesName(c, pki.NodeMarker(s.clusterName))
	switch other := s.foreign(c); {
	case other != "":
		return status.Errorf(codes.PermissionDenied, "peer: %q is a node certificate of another cluster (%s); this agent serves cluster %q", c.Subject.CommonName, other, s.clusterName)
	case nodeMarked && (s.storeMarker == "" || pki.CarriesName(c, s.storeMarker)):
	case s.now().Before(s.unmarkedUntil):
		// Issued before markers, and still accepted for a while.
	case nodeMarked:
		return status.Errorf(codes.PermissionDenied, "peer: node certificate %q carries this cluster's marker but not its store's (%s): it was issued before store markers existed; its agent reissues it when it runs this version, or --peer-accept-unmarked-until lets it pass for a while", c.Subject.CommonName, s.storeMarker)
	default:
		return status.Errorf(codes.PermissionDenied, "peer: node certificate %q carries no cluster marker (%s): it was issued before markers existed; its agent reissues it when it runs this version, or --peer-accept-unmarked-until lets it pass for a while", c.Subject.CommonName, pki.NodeMarker(s.clusterName))
	}
	if r, ok := req.(leaderRequest); ok && r.leader() != c.Subject.CommonName {
		return status.Errorf(codes.PermissionDenied, "peer: the request says node %q makes it, but comes with the certificate of node %q", r.leader(), c.Subject.CommonName)
	}
	return nil
}

// otherCluster returns the first name reserved for etcd-manager's own
// certificates that c carries and that is not this cluster's: another
// cluster's node or operator marker. "" when there is none.
func (s *Server) otherCluster(c *x509.Certificate) string {
	ours := []string{pki.NodeMarker(s.clusterName), pki.OperatorMarker(s.clusterName)}
	for _, name := range c.DNSNames {
		if !pki.IsReservedName(name) {
			continue
		}
		n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
		if pki.IsStoreMarker(n) {
			// Ours, or another store's when this server is bound to one.
			if s.storeMarker != "" && n != s.storeMarker {
				return name + ", a cluster named alike that keeps another backup store"
			}
			continue
		}
		if n != ours[0] && n != ours[1] {
			return name
		}
	}
	return ""
}

// foreign is otherCluster, but for a node certificate of this cluster
// under another store's marker while certificates without this store's
// pass (AcceptUnmarkedUntil): a cluster moving to another store, its
// agents restarted one at a time.
func (s *Server) foreign(c *x509.Certificate) string {
	other := s.otherCluster(c)
	if other != "" && pki.CarriesName(c, pki.NodeMarker(s.clusterName)) && s.otherStoreOnly(c) && s.now().Before(s.unmarkedUntil) {
		return ""
	}
	return other
}

// otherStoreOnly reports whether the only reserved names of c that are
// not this cluster's are store markers.
func (s *Server) otherStoreOnly(c *x509.Certificate) bool {
	ours := []string{pki.NodeMarker(s.clusterName), pki.OperatorMarker(s.clusterName), s.storeMarker}
	for _, name := range c.DNSNames {
		n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
		if pki.IsReservedName(n) && !pki.IsStoreMarker(n) && !slices.Contains(ours, n) {
			return false
		}
	}
	return true
}

// RegisterService adds another service to the server, such as the
// operator's calls (package operatorapi), which authorizes its callers
// itself. Call it before Serve.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(desc, impl)
}

// Serve serves on l until Stop.
func (s *Server) Serve(l net.Listener) error {
	return s.grpc.Serve(netutil.LimitListener(l, MaxConnections))
}

// Limits of the peer API's server: a handful of agents and one operator
// call it, so a peer that opens connections or streams without end, or
// holds idle ones, is cut off long before it costs the agent much.
const (
	// MaxConnections bounds the connections open at once; more wait in
	// the kernel's backlog.
	MaxConnections = 256
	// MaxStreams bounds the concurrent calls on one connection.
	MaxStreams = 64
	// HandshakeTimeout bounds a connection's TLS handshake.
	HandshakeTimeout = 10 * time.Second
)

func serverLimits() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxStreams),
		grpc.ConnectionTimeout(HandshakeTimeout),
		// A client may ping at most every 10 s, even with no call open;
		// more often, and its connection is closed.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// An idle connection is closed after 5 minutes, and a silent one
		// after a ping unanswered for 20 s.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute, Time: time.Minute, Timeout: 20 * time.Second}),
	}
}

// Stop stops the server, waiting briefly for calls in flight.
func (s *Server) Stop() {
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
	}
}

// Client calls one agent's peer API.
type Client struct {
	conn        *grpc.ClientConn
	clusterName string
	// redial makes the next Info wait for a connection (see Redial).
	redial atomic.Bool
}

// Dial returns a client for the agent at addr (host:port). It does not
// block: errors surface on the first call.
func Dial(addr, clusterName string, creds credentials.TransportCredentials) (*Client, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		// Peers restart and partitions heal; notice within seconds.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(codec{}.Name())))
	if err != nil {
		return nil, fmt.Errorf("peer: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, clusterName: clusterName}, nil
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the client's connection, for the other services the agent
// serves on it (package operatorapi).
func (c *Client) Conn() grpc.ClientConnInterface { return c.conn }

// Target is the address the client dials.
func (c *Client) Target() string { return c.conn.Target() }

// Redial has a connection that waits in its reconnect backoff dial again
// at once, and has the next Info wait for it (within its context) rather than
// fail with the error of the last dial: for a peer known to be up,
// as one that just announced itself, whose address refused connections
// moments before (its predecessor's, stopped).
func (c *Client) Redial() {
	c.redial.Store(true)
	c.conn.ResetConnectBackoff()
}

// Info asks the agent for its NodeInfo.
func (c *Client) Info(ctx context.Context) (NodeInfo, error) {
	return c.info(ctx, false)
}

// Announce is Info that also tells the peer that this node's state
// changed, so that its agent looks again at once.
func (c *Client) Announce(ctx context.Context) (NodeInfo, error) {
	return c.info(ctx, true)
}

func (c *Client) info(ctx context.Context, changed bool) (NodeInfo, error) {
	var info NodeInfo
	var opts []grpc.CallOption
	if c.redial.Swap(false) {
		opts = append(opts, grpc.WaitForReady(true))
	}
	err := c.conn.Invoke(ctx, "/"+serviceName+"/Info", &InfoRequest{ClusterName: c.clusterName, Changed: changed}, &info, opts...)
	if err != nil {
		return info, fmt.Errorf("peer: info from %s: %w", c.conn.Target(), err)
	}
	return info, nil
}

// Join tells the agent to become a member.
func (c *Client) Join(ctx context.Context, req JoinRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Join", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: join %s: %w", c.conn.Target(), err)
	}
	return nil
}

// Leave tells the agent to leave the cluster with req.Token.
func (c *Client) Leave(ctx context.Context, req LeaveRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Leave", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: leave %s: %w", c.conn.Target(), err)
	}
	return nil
}

// Restore tells the agent to restore a backup as a member of a new cluster.
func (c *Client) Restore(ctx context.Context, req RestoreRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Restore", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: restore on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// Quarantine sets the agent's etcd's quarantine.
func (c *Client) Quarantine(ctx context.Context, req QuarantineRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Quarantine", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: quarantine on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// Recover tells the agent to recover quorum from its member's data.
func (c *Client) Recover(ctx context.Context, req RecoverRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Recover", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: recover on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// SetVersion tells the agent to run etcd of another version on its data.
func (c *Client) SetVersion(ctx context.Context, req VersionRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/SetVersion", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: set version on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// SetSettings tells the agent to run etcd with the spec's etcd settings.
func (c *Client) SetSettings(ctx context.Context, req SettingsRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/SetSettings", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: set etcd settings on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// DiscardData tells the agent to set its etcd's data aside: it
// disagrees with the majority of its peers'.
func (c *Client) DiscardData(ctx context.Context, req DiscardRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/DiscardData", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: discard data on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// HashData asks the agent for its data's HashKV, read from its database.
func (c *Client) HashData(ctx context.Context, req HashDataRequest) (DataHash, error) {
	req.ClusterName = c.clusterName
	var res DataHash
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/HashData", &req, &res); err != nil {
		return DataHash{}, fmt.Errorf("peer: hash the data on %s: %w", c.conn.Target(), err)
	}
	return res, nil
}

// Resume tells the agent to start etcd once without its initial check.
func (c *Client) Resume(ctx context.Context, req ResumeRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Resume", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: resume etcd on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// Defrag tells the agent to defragment its etcd with its clients held
// off.
func (c *Client) Defrag(ctx context.Context, req DefragRequest) (DefragResult, error) {
	req.ClusterName = c.clusterName
	var res DefragResult
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Defrag", &req, &res); err != nil {
		return DefragResult{}, fmt.Errorf("peer: defragment on %s: %w", c.conn.Target(), err)
	}
	return res, nil
}

// SetPeerURLs tells the agent to serve its etcd's new peer URLs.
func (c *Client) SetPeerURLs(ctx context.Context, req PeerURLsRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/SetPeerURLs", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: set peer URLs on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// SetPeerCertCheck tells the agent to restart its etcd with another
// peer certificate check.
func (c *Client) SetPeerCertCheck(ctx context.Context, req PeerCertCheckRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/SetPeerCertCheck", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: set the peer certificate check on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// SyncCA tells the agent to take up the store's CA and trust, as a CA
// rotation goes.
func (c *Client) SyncCA(ctx context.Context, req CARequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/SyncCA", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: sync the CA on %s: %w", c.conn.Target(), err)
	}
	return nil
}

// Fence tells the agent that a driver of req.Term has taken over.
func (c *Client) Fence(ctx context.Context, req FenceRequest) error {
	req.ClusterName = c.clusterName
	if err := c.conn.Invoke(ctx, "/"+serviceName+"/Fence", &req, &Empty{}); err != nil {
		return fmt.Errorf("peer: fence %s: %w", c.conn.Target(), err)
	}
	return nil
}
