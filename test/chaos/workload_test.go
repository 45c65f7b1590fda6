package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The workload: clients doing puts, gets and compare-and-swap
// transactions on a few contended keys, plus puts to unique log keys, at
// a steady rate. Every operation on the contended keys goes into the
// history porcupine checks; every acknowledged log put must survive.

const (
	// contendedKeys spreads the workers so that, when a fault holds every
	// request and they all return at once, no key has so many operations
	// in flight that porcupine's search explodes (96 workers on 6 keys
	// once took it 2 minutes).
	contendedKeys = 16
	logPrefix     = "/chaos/log/"
	opTimeout     = 2 * time.Second
)

func contendedKey(i int) string { return fmt.Sprintf("/chaos/k%d", i) }

type workload struct {
	clients []*clientv3.Client
	workers int
	rate    int
	start   time.Time
	seed    uint64

	mu      sync.Mutex
	history []porcupine.Operation
	acked   []string // log keys whose put was acknowledged
	ackedAt []int64  // when each was, as now() says
	ops     int      // operations sent, all kinds
	failed  int

	stop chan struct{}
	done sync.WaitGroup
}

func newWorkload(endpoints []string, tlsCfg *tls.Config, clients, workers, rate int, seed uint64) (*workload, error) {
	w := &workload{workers: workers, rate: rate, start: time.Now(), seed: seed}
	for range clients {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tlsCfg, DialTimeout: 2 * time.Second,
			Logger: zap.NewNop(), AutoSyncInterval: 0})
		if err != nil {
			w.close()
			return nil, err
		}
		w.clients = append(w.clients, c)
	}
	return w, nil
}

func (w *workload) close() {
	for _, c := range w.clients {
		c.Close()
	}
}

func (w *workload) now() int64 { return int64(time.Since(w.start)) }

// run starts the workers; halt stops them and waits for requests in
// flight. maxOps bounds a round's operations.
func (w *workload) run(round, maxOps int) {
	w.stop = make(chan struct{})
	tokens := make(chan struct{})
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		defer close(tokens)
		t := time.NewTicker(time.Second / time.Duration(w.rate))
		defer t.Stop()
		for range maxOps {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			select {
			case tokens <- struct{}{}:
			case <-w.stop:
				return
			default: // every worker busy: the op is skipped, not queued
			}
		}
	}()
	for i := range w.workers {
		c := w.clients[i%len(w.clients)]
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			rng := rand.New(rand.NewPCG(w.seed, uint64(round*1000+i)))
			seq := 0
			for range tokens {
				seq++
				w.one(c, i, rng, fmt.Sprintf("r%d-c%d-%d", round, i, seq))
			}
		}()
	}
}

// halt stops the workers and waits for them; halting a stopped workload
// does nothing.
func (w *workload) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.done.Wait()
}

// one sends one operation and records it.
func (w *workload) one(c *clientv3.Client, client int, rng *rand.Rand, id string) {
	// A member that has lost its leader (partitioned, say) refuses at
	// once instead of holding the request until it times out, as
	// Kubernetes' clients ask too.
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), opTimeout)
	defer cancel()
	key := contendedKey(rng.IntN(contendedKeys))
	p := rng.IntN(100)
	call := w.now()
	var in kvInput
	var out kvOutput
	var err error
	switch {
	case p < 10:
		k := logPrefix + id
		_, err = c.Put(ctx, k, "x")
		w.mu.Lock()
		w.ops++
		if err == nil {
			w.acked = append(w.acked, k)
			w.ackedAt = append(w.ackedAt, w.now())
		} else {
			w.failed++
		}
		w.mu.Unlock()
		return
	case p < 45:
		in = kvInput{Op: opPut, Key: key, Value: id}
		_, err = c.Put(ctx, key, id)
	case p < 75:
		in = kvInput{Op: opGet, Key: key}
		var resp *clientv3.GetResponse
		if resp, err = c.Get(ctx, key); err == nil && len(resp.Kvs) > 0 {
			out.Value = string(resp.Kvs[0].Value)
		}
	default:
		// Compare against a value this key may well hold: the last one
		// read by anyone, so that both outcomes occur.
		in = kvInput{Op: opCAS, Key: key, Value: id, Expect: w.lastRead(key)}
		var resp *clientv3.TxnResponse
		resp, err = c.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", in.Expect)).Then(clientv3.OpPut(key, id)).Commit()
		if err == nil {
			out.OK = resp.Succeeded
		}
	}
	ret := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ops++
	if err != nil {
		w.failed++
		if in.Op == opGet {
			return // a failed read changes nothing
		}
		out, ret = kvOutput{Unknown: true}, math.MaxInt64
	}
	w.history = append(w.history, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// lastRead is the value the latest successful read of key returned.
func (w *workload) lastRead(key string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.history) - 1; i >= 0; i-- {
		op := w.history[i]
		if in := op.Input.(kvInput); in.Key == key && in.Op == opGet {
			return op.Output.(kvOutput).Value
		}
	}
	return ""
}

// take returns the round's history and acknowledged log keys, and
// starts afresh.
func (w *workload) take() (history []porcupine.Operation, acked []string, ops, failed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	history, acked, ops, failed = w.history, w.acked, w.ops, w.failed
	w.history, w.acked, w.ackedAt, w.ops, w.failed = nil, nil, nil, 0, 0
	return
}

// ackedBefore returns the log keys whose put was acknowledged before t.
func (w *workload) ackedBefore(t int64) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for i, at := range w.ackedAt {
		if at < t {
			out = append(out, w.acked[i])
		}
	}
	return out
}
