package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// TestSummarizeHeap: memory is charged to the innermost function outside
// the allocation helpers, totalled, and the largest come first.
func TestSummarizeHeap(t *testing.T) {
	fn := func(name string) *profile.Location {
		return &profile.Location{Line: []profile.Line{{Function: &profile.Function{Name: name}}}}
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"}},
		Sample: []*profile.Sample{
			{Value: []int64{1, 5 << 20}, Location: []*profile.Location{fn("runtime.mallocgc"), fn("io.ReadAll"), fn("github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager.(*uploader).nextReader")}},
			{Value: []int64{2, 10 << 20}, Location: []*profile.Location{fn("github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager.newDefaultSlicePool")}},
			{Value: []int64{1, 1 << 20}, Location: []*profile.Location{fn("runtime.malg"), fn("runtime.newproc1")}},
			{Value: []int64{1, 1 << 20}, Location: []*profile.Location{fn("bufio.NewWriterSize"), fn("github.com/etcd-manager/etcd-manager/internal/backup.upload")}},
			{Value: []int64{1, 2 << 20}, Location: []*profile.Location{fn("github.com/etcd-manager/etcd-manager/internal/backup.upload")}},
		},
	}
	got := summarizeHeap(p, 3)
	if got.inUseMiB != 19 {
		t.Errorf("%.1f MiB in use, want 19", got.inUseMiB)
	}
	want := []heapHolder{
		{fn: "transfermanager.newDefaultSlicePool", mib: 10},
		{fn: "transfermanager.(*uploader).nextReader", mib: 5},
		{fn: "backup.upload", mib: 3},
	}
	if len(got.top) != len(want) {
		t.Fatalf("top %v, want %v", got.top, want)
	}
	for i := range want {
		if got.top[i] != want[i] {
			t.Errorf("top[%d] = %v, want %v", i, got.top[i], want[i])
		}
	}
	if s := (heapSummary{}).String(); !strings.HasPrefix(s, "no heap profile was read") {
		t.Errorf("an empty summary reads %q", s)
	}
	if s := summarizeHeap(&profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space"}}}, 3); s.inUseMiB != 0 || len(s.top) != 0 {
		t.Errorf("a profile without inuse_space summarized as %+v", s)
	}
}

// TestAgentBackupStages reads the stages from the agent's line for the
// named backup only, and nothing from a line that lacks one.
func TestAgentBackupStages(t *testing.T) {
	log := `time=2026-11-28T16:02:06.100Z level=INFO msg="backup taken" name=2026-11-28T16:02:06Z-000001 reason=backup-now size=1 duration=5.39s stream=4.47s verify=812ms commit=2ms hashkv-beside-check=true
time=2026-11-28T16:03:00.000Z level=INFO msg="backup taken" name=2026-11-28T16:03:00Z-000001 reason=periodic size=1 duration=6s stream=5s verify=900ms
`
	tests := []struct {
		name, want string
		ok         bool
	}{
		{name: "2026-11-28T16:02:06Z-000001", want: "stream 4.47s, verify 812ms, commit 2ms", ok: true},
		{name: "2026-11-28T16:03:00Z-000001"}, // no commit field
		{name: "2026-11-28T16:04:00Z-000001"}, // not logged
	}
	for _, tt := range tests {
		got, ok := agentBackupStages(log, tt.name)
		if got != tt.want || ok != tt.ok {
			t.Errorf("agentBackupStages(%s) = %q, %v; want %q, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
	if d, ok := agentBackupDuration(log, "2026-11-28T16:02:06Z-000001"); !ok || d != 5390*time.Millisecond {
		t.Errorf("agentBackupDuration = %v, %v; want 5.39s", d, ok)
	}
}
