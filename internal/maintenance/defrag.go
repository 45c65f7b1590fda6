package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// defragTimeout bounds one member's defragmentation: etcd rewrites its
// whole database, about a second per few hundred MiB on a slow disk.
const defragTimeout = 10 * time.Minute

// isolatedDefragRetry is how long a node whose isolated defragmentation
// failed is defragmented in place instead.
const isolatedDefragRetry = time.Hour

// Defragger carries out the leader's defragmentations (plan.DefragMember):
// in place through etcd, or isolated through the member's agent while the
// other voters are watched. It remembers the nodes whose isolated ones
// fail, to defragment them in place for a while. Create it with
// NewDefragger; it belongs to the loop's goroutine.
type Defragger struct {
	log *slog.Logger
	now func() time.Time
	met defragMetrics
	// failed is when each node's isolated defragmentation last failed.
	failed map[string]time.Time
	// stops counts each node's isolated defragmentations stopped in a
	// row because the cluster degraded meanwhile.
	stops map[string]int
}

// NewDefragger returns a defragger whose metrics reg takes.
func NewDefragger(log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *Defragger {
	return &Defragger{log: log, now: now, met: newDefragMetrics(reg)}
}

// Etcd is what a defragmentation in place asks of the leader's etcd
// client.
type Etcd interface {
	etcdproc.Statuser
	Defragment(ctx context.Context, endpoint string) (*clientv3.DefragmentResponse, error)
}

// Member is what an isolated defragmentation asks of the member's agent,
// this one or a peer.
type Member interface {
	Defrag(ctx context.Context, req peer.DefragRequest) (peer.DefragResult, error)
}

// Probe reads one member's status; an error counts as a miss.
type Probe func(ctx context.Context) error

// Job is one member's defragmentation.
type Job struct {
	Act plan.DefragMember
	// Etcd is the leader's client, which measures the database and, in
	// place, defragments it.
	Etcd Etcd
	// Member, Request and Others are an isolated defragmentation's: the
	// member's agent (found when the defragmentation begins), what it is
	// asked, and a probe of each voter left to keep quorum meanwhile (see
	// StatusProbe).
	Member  func() (Member, error)
	Request peer.DefragRequest
	Others  map[string]Probe
}

// Defrag defragments the job's member and returns its record. The caller
// checked that this agent leads and that the member's etcd does not.
func (d *Defragger) Defrag(ctx context.Context, job Job) (peer.DefragRecord, error) {
	act := job.Act
	mode := "in place"
	if act.Isolate {
		mode = "isolated"
	}
	d.log.Info("defragmenting a member", "node", act.NodeID, "mode", mode, "reason", act.Reason)
	start := d.now()
	var before, after int64
	var err error
	if act.Isolate {
		var res peer.DefragResult
		res, err = d.isolated(ctx, job)
		before, after = res.SizeBefore, res.SizeAfter
	} else {
		before = memberDBSize(ctx, job.Etcd, act.ClientURL)
		dctx, cancel := context.WithTimeout(ctx, defragTimeout)
		_, err = job.Etcd.Defragment(dctx, act.ClientURL)
		cancel()
		if err == nil {
			after = memberDBSize(ctx, job.Etcd, act.ClientURL)
		}
	}
	took := d.now().Sub(start)
	if err != nil {
		d.met.defrags.WithLabelValues("failure").Inc()
		return peer.DefragRecord{}, fmt.Errorf("maintenance: defrag %s %s: %w", act.NodeID, mode, err)
	}
	d.met.defrags.WithLabelValues("success").Inc()
	d.met.lastOK.Set(float64(d.now().Unix()))
	d.met.lastDuration.Set(took.Seconds())
	if before > 0 && after > 0 {
		d.met.lastReclaimed.Set(float64(max(before-after, 0)))
	}
	d.log.Info("member defragmented", "node", act.NodeID, "mode", mode, "duration", took.Round(time.Millisecond), "db-size-before", before, "db-size-after", after)
	return peer.DefragRecord{Node: act.NodeID, At: start.UTC(), Duration: took, SizeBefore: before, SizeAfter: after, Isolated: act.Isolate}, nil
}

// isolated has the member's agent defragment its database offline, its
// etcd stopped meanwhile. The cluster has one voter fewer for that long,
// so the leader watches the others throughout (see watchOthers): should
// one stop answering, the member's agent is told to stop, and its etcd
// starts again on the database as it was. Another failure turns the
// member to defragmentation in place for isolatedDefragRetry.
func (d *Defragger) isolated(ctx context.Context, job Job) (peer.DefragResult, error) {
	node := job.Act.NodeID
	member, err := job.Member()
	if err != nil {
		return peer.DefragResult{}, err
	}
	dctx, cancel := context.WithTimeout(ctx, defragTimeout)
	defer cancel()
	wctx, stop := context.WithCancelCause(dctx)
	defer stop(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchOthers(wctx, job.Others, defragWatchInterval, stop)
	}()
	res, err := member.Defrag(wctx, job.Request)
	stop(nil)
	<-watched
	if err == nil {
		d.isolatedDone(node)
		return res, nil
	}
	if cause := context.Cause(wctx); errors.Is(cause, errClusterDegraded) {
		d.isolatedStopped(node, cause)
		return res, fmt.Errorf("maintenance: defrag %s stopped: %w", node, cause)
	}
	d.isolatedInPlace(node, err)
	return res, err
}

// InPlace is the nodes to defragment in place for now, their isolated
// defragmentation having failed within isolatedDefragRetry; nil for none.
func (d *Defragger) InPlace() map[string]bool {
	var out map[string]bool
	for id, at := range d.failed {
		if d.now().Sub(at) < isolatedDefragRetry {
			if out == nil {
				out = map[string]bool{}
			}
			out[id] = true
		}
	}
	return out
}

// isolatedDone ends node's run of stopped isolated defragmentations.
func (d *Defragger) isolatedDone(node string) {
	delete(d.stops, node)
}

// isolatedStopped counts a stop of node's isolated defragmentation for a
// degraded cluster. A member that keeps stopping the copy (one that
// flaps, or answers too slowly) would have this one restarted for
// nothing, round after round: after maxDefragStops in a row, the node is
// defragmented in place for isolatedDefragRetry.
func (d *Defragger) isolatedStopped(node string, cause error) {
	if d.stops == nil {
		d.stops = map[string]int{}
	}
	d.stops[node]++
	d.log.Warn("isolated defragmentation stopped: another member stopped answering; the member serves again on its database as it was",
		"node", node, "stops-in-a-row", d.stops[node], "error", cause)
	if d.stops[node] >= maxDefragStops {
		delete(d.stops, node)
		d.isolatedInPlace(node, fmt.Errorf("stopped %d times in a row: %w", maxDefragStops, cause))
	}
}

// isolatedInPlace has node be defragmented in place, not isolated, for
// isolatedDefragRetry.
func (d *Defragger) isolatedInPlace(node string, why error) {
	if d.failed == nil {
		d.failed = map[string]time.Time{}
	}
	d.failed[node] = d.now()
	d.log.Warn("isolated defragmentation failed: the member is defragmented in place for a while instead",
		"node", node, "for", isolatedDefragRetry, "error", why)
}

// StatusProbe probes the member at url through c, a client of that
// member: a member cut off from the others answers on its client port,
// but sees no leader once its election timeout passes, and counts as a
// miss.
func StatusProbe(c *clientv3.Client, url string) Probe {
	return func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, defragWatchTimeout)
		defer cancel()
		st, err := etcdproc.MemberStatusOf(sctx, c, url)
		if err != nil {
			return err
		}
		if st.Leader == 0 {
			return errNoLeader
		}
		return nil
	}
}

// memberDBSize is the database size a member reports, 0 when it does not
// answer.
func memberDBSize(ctx context.Context, c etcdproc.Statuser, endpoint string) int64 {
	st, err := etcdproc.AskStatus(ctx, c, endpoint)
	if err != nil {
		return 0
	}
	return st.DbSize
}

// maxDefragStops is how many isolated defragmentations of a node in a
// row may be stopped for a degraded cluster before it is defragmented in
// place for isolatedDefragRetry instead.
const maxDefragStops = 3

// defragWatchInterval is how often the leader reads the other voters'
// status while a member is defragmented offline; defragWatchTimeout
// bounds each read, and defragWatchMisses reads in a row that one voter
// fails stop the defragmentation.
const (
	defragWatchInterval = 500 * time.Millisecond
	defragWatchTimeout  = time.Second
	defragWatchMisses   = 2
)

// errClusterDegraded is the cause of an isolated defragmentation stopped
// because another voter stopped answering.
var errClusterDegraded = errors.New("maintenance: the cluster degraded during an isolated defragmentation")

// errNoLeader is a probe's answer from a member that sees no raft leader.
var errNoLeader = errors.New("maintenance: the member sees no raft leader")

// watchOthers probes every member each interval until ctx ends. When one
// fails defragWatchMisses probes in a row, it calls stop with an error
// wrapping errClusterDegraded that names the member, and returns.
func watchOthers(ctx context.Context, probes map[string]Probe, interval time.Duration, stop context.CancelCauseFunc) {
	misses := map[string]int{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, name := range slices.Sorted(maps.Keys(probes)) {
			err := probes[name](ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				misses[name] = 0
				continue
			}
			misses[name]++
			if misses[name] >= defragWatchMisses {
				stop(fmt.Errorf("%w: member %s failed %d status reads in a row: %w", errClusterDegraded, name, misses[name], err))
				return
			}
		}
	}
}
