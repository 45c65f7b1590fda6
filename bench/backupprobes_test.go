package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// heapSummary is what a heap profile of the agent held at its largest
// during a backup.
type heapSummary struct {
	inUseMiB float64
	top      []heapHolder // the largest first
	profiles int          // how many profiles were read
}

// heapHolder is the memory in use that one function allocated.
type heapHolder struct {
	fn  string
	mib float64
}

func (h heapSummary) String() string {
	if h.profiles == 0 {
		return "no heap profile was read (none is at the large scale, where one more backup would need another 16 GiB of disk)"
	}
	parts := make([]string, len(h.top))
	for i, x := range h.top {
		parts[i] = fmt.Sprintf("%.1f MiB %s", x.mib, x.fn)
	}
	return fmt.Sprintf("%.1f MiB in use at the largest of %d profiles, allocated by: %s", h.inUseMiB, h.profiles, strings.Join(parts, ", "))
}

// profiledBackup restarts the agent with its Go profiles served
// (--enable-pprof on a metrics address), takes one more backup, and reads
// the agent's heap profile every 250ms meanwhile. It returns the largest
// one's summary. The measured backups run before it, without the flags,
// so that the profile reads do not weigh on their figures.
func profiledBackup(t *testing.T, env *harness.Env, agent *harness.Agent, extra []string) heapSummary {
	t.Helper()
	u, err := url.Parse(agent.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	addr := u.Hostname() + ":9100"
	agent.Stop()
	agent.SetExtraArgs(append(slices.Clip(extra), "--metrics-address="+addr, "--enable-pprof")...)
	agent.Start()
	harness.WaitSettled(t, []*harness.Agent{agent}, 1, 2*time.Minute)

	done := make(chan struct{})
	var sum heapSummary
	var largest *profile.Profile
	var name string
	var berr error
	go func() {
		defer close(done)
		_, name, berr = tryBackupNow(env)
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if berr != nil {
				t.Fatalf("the profiled backup: %v", berr)
			}
			t.Logf("profiled backup %s taken", name)
			keepProfile(t, largest, strings.ReplaceAll(t.Name(), "/", "-")+"-heap.pb.gz")
			return sum
		case <-tick.C:
		}
		p, err := heapProfile(client, "http://"+addr+"/debug/pprof/heap")
		if err != nil {
			t.Logf("heap profile: %v", err)
			continue
		}
		if s := summarizeHeap(p, 6); s.inUseMiB > sum.inUseMiB {
			s.profiles = sum.profiles
			sum = s
			largest = p
		}
		sum.profiles++
	}
}

// keepProfile writes p under $BENCH_PROFILE_DIR, when it is set, for
// go tool pprof.
func keepProfile(t *testing.T, p *profile.Profile, name string) {
	t.Helper()
	dir := os.Getenv("BENCH_PROFILE_DIR")
	if dir == "" || p == nil {
		return
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("keep the heap profile: %v", err)
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		t.Fatalf("keep the heap profile: %v", err)
	}
	t.Logf("heap profile kept in %s", f.Name())
}

// maxProfileBytes bounds a heap profile read from the agent.
const maxProfileBytes = 16 << 20

func heapProfile(c *http.Client, addr string) (*profile.Profile, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", addr, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxProfileBytes))
	if err != nil {
		return nil, err
	}
	return profile.Parse(bytes.NewReader(data))
}

// summarizeHeap totals a heap profile's inuse_space and names the n
// functions that allocated the most of it (each sample counted at the
// innermost frame outside the runtime's and the standard library's
// allocation helpers, so that a buffer is named by what asked for it).
func summarizeHeap(p *profile.Profile, n int) heapSummary {
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			idx = i
		}
	}
	if idx < 0 {
		return heapSummary{}
	}
	by := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[idx]
		total += v
		by[allocator(s)] += v
	}
	var out heapSummary
	out.inUseMiB = mib(total)
	for fn, v := range by {
		out.top = append(out.top, heapHolder{fn: fn, mib: mib(v)})
	}
	slices.SortFunc(out.top, func(a, b heapHolder) int {
		switch {
		case a.mib > b.mib:
			return -1
		case a.mib < b.mib:
			return 1
		}
		return strings.Compare(a.fn, b.fn)
	})
	if len(out.top) > n {
		out.top = out.top[:n]
	}
	return out
}

// allocHelpers are frames that allocate on behalf of their caller.
var allocHelpers = []string{"runtime.", "bytes.", "io.ReadAll", "bufio.", "strings.", "encoding/", "reflect."}

// allocator is the function a sample's memory is charged to: its
// innermost frame that is not an allocation helper.
func allocator(s *profile.Sample) string {
	first := ""
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function == nil {
				continue
			}
			name := line.Function.Name
			if first == "" {
				first = name
			}
			helper := false
			for _, h := range allocHelpers {
				if strings.HasPrefix(name, h) {
					helper = true
					break
				}
			}
			if !helper {
				return shortFunc(name)
			}
		}
	}
	if first == "" {
		return "(unknown)"
	}
	return shortFunc(first)
}

// shortFunc drops a function name's module path, keeping its package:
// google.golang.org/grpc/mem.(*pool).Get becomes mem.(*pool).Get.
func shortFunc(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[i+1:]
	}
	return name
}

// storeFloor is how long a store took to take in a backup's object by
// itself: the object uploaded again from a local file by the agent's own
// store code, with no snapshot, gzip or etcd beside it.
type storeFloor struct {
	secs     []float64 // each upload's
	storeCPU []float64 // the store process's CPU time during each
	bytes    int64
}

func (f storeFloor) String() string {
	return fmt.Sprintf("%s s (the store's own CPU %s s) for %.0f MiB", fmtList(f.secs), fmtList(f.storeCPU), mib(f.bytes))
}

// note says what the floor means against the baseline's seconds.
func (f storeFloor) note(base float64) string {
	if len(f.secs) == 0 {
		return "the store's floor was not measured"
	}
	secs, cpu := medianOr0(f.secs), medianOr0(f.storeCPU)
	return fmt.Sprintf("the floor, what this MinIO takes by itself: the same %.0f MiB object uploaded again from a local file by the agent's store code in the benchmark's process, nothing else running, took %s s (median %.2f s, %.2f× the baseline), and MinIO used %s CPU-seconds for it (median %.2f, %.0f%% of one core throughout), on the same 2 cores as etcd and the agent",
		mib(f.bytes), fmtList(f.secs), secs, ratio(secs, base), fmtList(f.storeCPU), cpu, 100*cpu/max(secs, 1e-9))
}

// floorUploads is how many times measureFloor uploads the object, at
// most.
const floorUploads = 2

// measureFloor downloads backup name's data object from env's store to
// a local file, then uploads it the given number of times through the
// store package, timing each and reading the store process pid's CPU
// time. The local copy is deleted before it returns.
func measureFloor(t *testing.T, env *harness.Env, name string, pid, uploads int) storeFloor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), backupTimeout)
	defer cancel()
	s, err := store.Open(ctx, env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := name + "/" + backup.DataObject
	r, err := s.Reader(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "object")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path) // as large as the backup: not left for the test's end
	n, err := io.Copy(f, r)
	r.Close()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("download %s: %v", key, err)
	}
	out := storeFloor{bytes: n}
	for i := range max(uploads, 1) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		dst := fmt.Sprintf("floor/%d", i)
		cpu0, start := cpuTicks(t, pid), time.Now()
		err = s.Put(ctx, dst, f)
		secs := time.Since(start).Seconds()
		cpu := float64(cpuTicks(t, pid)-cpu0) / userHZ
		f.Close()
		if err != nil {
			t.Fatalf("upload %s again: %v", key, err)
		}
		if err := s.Delete(ctx, dst); err != nil {
			t.Fatal(err)
		}
		out.secs, out.storeCPU = append(out.secs, secs), append(out.storeCPU, cpu)
	}
	return out
}
