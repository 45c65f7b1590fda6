package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/peer"
)

// ctlEnv is a file store. The ctl needs no etcd installs.
type ctlEnv struct {
	store string
}

func newCtlEnv(t *testing.T) ctlEnv {
	t.Helper()
	return ctlEnv{store: "file://" + filepath.Join(t.TempDir(), "backups", "test")}
}

func (e ctlEnv) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--backup-store=" + e.store, "--store-attempts=1"}, args...)
	err = run(t.Context(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestConfigureAndGet(t *testing.T) {
	e := newCtlEnv(t)
	// The walkthrough's spelling, single-dash long flags included.
	out, _, err := e.run(t, "-member-count=1", "-etcd-version=3.6.16", "configure-cluster")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "memberCount=1 etcdVersion=3.6.16") {
		t.Errorf("configure-cluster printed %q", out)
	}
	out, _, err = e.run(t, "get")
	if err != nil {
		t.Fatal(err)
	}
	if out != "memberCount: 1\netcdVersion: 3.6.16\ncompaction: keep 1h of history (the default)\n" {
		t.Errorf("get printed %q", out)
	}
	// A flag left out keeps its value.
	if _, _, err := e.run(t, "--member-count=3", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	out, _, err = e.run(t, "get", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"memberCount": 3`) || !strings.Contains(out, `"etcdVersion": "3.6.16"`) {
		t.Errorf("get -o json printed %q", out)
	}
}

func TestConfigureClusterBadInput(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		wantErr     string
		wantWarning string
	}{
		{name: "member count zero", args: []string{"--member-count=0", "--etcd-version=3.6.16"}, wantErr: "member count must be at least 1"},
		{name: "member count negative", args: []string{"--member-count=-3", "--etcd-version=3.6.16"}, wantErr: "member count must be at least 1"},
		{name: "even member count warns", args: []string{"--member-count=2", "--etcd-version=3.6.16"}, wantWarning: "even member count (2)"},
		{name: "nine members", args: []string{"--member-count=9", "--etcd-version=3.6.16"}},
		{name: "more than nine members", args: []string{"--member-count=11", "--etcd-version=3.6.16"},
			wantErr: "--member-count=11: spec: member count is above 9: every write waits for a majority of the members, so each one more slows writes; etcd advises 3 or 5 members, 7 at most; add --force to set it anyway"},
		{name: "more than nine members, forced", args: []string{"--member-count=11", "--etcd-version=3.6.16", "--force"}, wantWarning: "a member count of 11 is above 9"},
		{name: "v2", args: []string{"--member-count=1", "--etcd-version=2.2.1"}, wantErr: "etcd v2 is not supported"},
		{name: "unparsable version", args: []string{"--member-count=1", "--etcd-version=3.six"}, wantErr: "invalid etcd version"},
		{name: "new spec needs both flags", args: []string{"--member-count=1"}, wantErr: "needs both --member-count and --etcd-version"},
		{name: "no flags", args: nil, wantErr: "needs --member-count, --etcd-version, --auto-compaction-mode, --auto-compaction-retention, a defrag policy flag or an etcd setting"},
		{name: "a bad defrag window", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--defrag-window=at 3"}, wantErr: `--defrag-window "at 3"`},
		{name: "a zero defrag threshold", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--defrag-min-reclaimable-bytes=0"}, wantErr: "must be above 0"},
		{name: "a defrag window with a time zone", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--defrag-window=TZ=x"}, wantErr: "no time zone"},
		{name: "a defrag fraction above 1", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--defrag-min-reclaimable-fraction=2"}, wantErr: "is not between 0 and 1"},
		{name: "a malformed setting", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--quota-backend-bytes=8GiB"}, wantErr: `--quota-backend-bytes="8GiB": want a whole number`},
		{name: "a setting the version lacks", args: []string{"--member-count=1", "--etcd-version=3.5.35", "--warning-apply-duration=1s"}, wantErr: "--warning-apply-duration is unknown to etcd 3.5.35"},
		{name: "timeouts etcd refuses", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--heartbeat-interval=500"}, wantErr: "must be at least 5 times --heartbeat-interval"},
		{name: "unknown compaction mode", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--auto-compaction-mode=hourly", "--auto-compaction-retention=1"}, wantErr: `mode "hourly" is neither periodic nor revision`},
		{name: "revision retention not a count", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--auto-compaction-mode=revision", "--auto-compaction-retention=1h"}, wantErr: `revision retention "1h" is not a count`},
		{name: "periodic retention not a duration", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--auto-compaction-retention=soon"}, wantErr: `periodic retention "soon" is neither a duration`},
		{name: "revision mode needs a retention", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--auto-compaction-mode=revision"}, wantErr: "revision mode needs a retention"},
		{name: "short retention warns", args: []string{"--member-count=1", "--etcd-version=3.6.16", "--auto-compaction-retention=30s"}, wantWarning: "compaction keeps only 30s of history"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			_, stderr, err := e.run(t, append(tt.args, "configure-cluster")...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
				}
				// Nothing was written.
				if _, _, gerr := e.run(t, "get"); gerr == nil {
					t.Error("a refused configure-cluster still wrote a spec")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantWarning == "" {
				if strings.Contains(stderr, "member count") {
					t.Errorf("stderr %q has a warning about the member count", stderr)
				}
				return
			}
			if !strings.Contains(stderr, "warning: ") || !strings.Contains(stderr, tt.wantWarning) {
				t.Errorf("stderr %q lacks warning %q", stderr, tt.wantWarning)
			}
		})
	}
}

// configure-cluster checks a version against what the nodes report in
// their records, not against this machine, which has no etcd.
func TestVersionCheckedAgainstTheNodes(t *testing.T) {
	type rec struct {
		node     string
		versions []string
		age      time.Duration
		standby  bool
	}
	both := []string{"3.5.35", "3.6.16"}
	tests := []struct {
		name        string
		records     []rec
		args        []string
		wantErr     []string
		wantWarning []string
		noWarning   bool
		planted     map[string]string // raw records, by key
	}{
		{name: "no node has reported", args: []string{"--etcd-version=3.6.99"},
			wantWarning: []string{"no node has reported its installed etcd versions in the last 10m0s", "etcd 3.6.99 is not checked against the nodes"}},
		{name: "only agents older than the report", records: []rec{{node: "a"}, {node: "b"}}, args: []string{"--etcd-version=3.6.99"},
			wantWarning: []string{"no node has reported"}},
		{name: "every node has it", records: []rec{{"a", both, time.Second, false}, {"b", both, time.Minute, false}}, args: []string{"--etcd-version=3.5.35"}, noWarning: true},
		{name: "the spec's own version is not checked again", records: []rec{{"a", []string{"3.5.35"}, time.Second, false}}, args: []string{"--etcd-version=3.6.16", "--member-count=3"}, noWarning: true},
		{name: "a standby lacks it", records: []rec{{"a", both, time.Second, false}, {"s", []string{"3.6.16"}, time.Second, true}}, args: []string{"--etcd-version=3.5.35"}, noWarning: true},
		{name: "a node lacks it", records: []rec{{"a", both, time.Second, false}, {"b", []string{"3.6.16"}, time.Second, false}, {"c", []string{"3.4.23"}, time.Second, false}},
			args:    []string{"--etcd-version=3.5.35"},
			wantErr: []string{"--etcd-version=3.5.35: no etcd 3.5.35 on node b (has 3.6.16), node c (has 3.4.23); install etcd-v3.5.35/etcd under each node's --etcd-bin-dir"}},
		{name: "--skip-binary-check skips nothing", records: []rec{{"a", []string{"3.6.16"}, time.Second, false}}, args: []string{"--etcd-version=3.5.35", "--skip-binary-check"},
			wantErr: []string{"no etcd 3.5.35 on node a"}},
		{name: "a node not heard from lacks it", records: []rec{{"a", both, time.Second, false}, {"b", []string{"3.6.16"}, time.Hour, false}}, args: []string{"--etcd-version=3.5.35"},
			wantWarning: []string{"node b (last heard from 1h0m0s ago), not heard from for over 10m0s, lacks etcd 3.5.35"}},
		{name: "every node that reported is silent", records: []rec{{"a", []string{"3.6.16"}, time.Hour, false}}, args: []string{"--etcd-version=3.5.35"},
			wantWarning: []string{"node a (last heard from 1h0m0s ago)", "no node has reported"}},
		{name: "no version flag, no check", records: []rec{{"a", []string{"3.4.23"}, time.Second, false}}, args: []string{"--member-count=3"}, noWarning: true},
		{name: "a record with no time lacks it", planted: map[string]string{"discovery/x": `{"nodeId":"x","address":"127.0.0.1:8000","etcdVersions":["3.6.16"]}`},
			args: []string{"--etcd-version=3.5.35"}, wantWarning: []string{"node x (its record says not when it was written)", "no node has reported"}},
		{name: "an unreadable record", records: []rec{{"a", []string{"3.6.16"}, time.Second, false}}, planted: map[string]string{"discovery/huge": strings.Repeat(" ", 17<<10)},
			args: []string{"--etcd-version=3.5.35"}, wantErr: []string{"no etcd 3.5.35 on node a"}},
		{name: "an unreadable record beside good ones", records: []rec{{"a", both, time.Second, false}}, planted: map[string]string{"discovery/huge": strings.Repeat(" ", 17<<10)},
			args: []string{"--etcd-version=3.5.35"}, wantWarning: []string{"cannot read every node's record", "discovery/huge"}},
		{name: "hostile text in a record", planted: map[string]string{"discovery/h": `{"nodeId":"h\u001b[2J","address":"127.0.0.1:8000","updated":"` + time.Now().UTC().Format(time.RFC3339) + `","etcdVersions":["3.6.16","\u001b]0;x\u0007"],"etcd":{"clusterToken":"t"}}`},
			args: []string{"--etcd-version=3.5.35"}, wantErr: []string{`no etcd 3.5.35 on node h`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			s := e.open(t)
			for _, r := range tt.records {
				pr := peer.Record{NodeID: r.node, Address: "127.0.0.1:8000", EtcdVersions: r.versions}
				if !r.standby {
					pr.Etcd = &peer.EtcdReport{ClusterToken: "tok"}
				}
				if err := peer.PublishToStore(t.Context(), s, pr, time.Now().Add(-r.age)); err != nil {
					t.Fatal(err)
				}
			}
			for key, data := range tt.planted {
				if err := s.Write(t.Context(), key, []byte(data)); err != nil {
					t.Fatal(err)
				}
			}
			_, stderr, err := e.run(t, append(tt.args, "configure-cluster")...)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatal("no error")
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("err %q does not mention %q", err, want)
					}
				}
				if exitCode(err) != exitFailed {
					t.Errorf("exit status %d, want %d", exitCode(err), exitFailed)
				}
				var report bytes.Buffer
				printError(&report, err)
				checkTerminalSafe(t, "the error", report.String())
				if out, _, _ := e.run(t, "get"); !strings.Contains(out, "etcdVersion: 3.6.16\n") {
					t.Errorf("a refused version was written: %s", out)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkTerminalSafe(t, "stderr", stderr)
			for _, want := range tt.wantWarning {
				if !strings.Contains(stderr, "warning: ") || !strings.Contains(stderr, want) {
					t.Errorf("stderr %q lacks the warning %q", stderr, want)
				}
			}
			if tt.noWarning && strings.Contains(stderr, "node") {
				t.Errorf("stderr %q warns about the nodes", stderr)
			}
		})
	}
}

// The flags of the old local check are still accepted, do nothing, say
// so on stderr only, and are gone from --help.
func TestDeprecatedFlags(t *testing.T) {
	e := newCtlEnv(t)
	out, stderr, err := e.run(t, "--member-count=1", "--etcd-version=3.6.99", "--etcd-bin-dir=/nonexistent", "--skip-binary-check", "configure-cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"warning: --etcd-bin-dir is deprecated and does nothing: the ctl runs no etcd",
		"warning: --skip-binary-check is deprecated and does nothing: configure-cluster checks a version against what the nodes report installed, not this machine; drop it",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
	if strings.Contains(out, "deprecated") {
		t.Errorf("the deprecation went to stdout: %q", out)
	}
	// The operator's spelling, and the flag after the command name.
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "--ordinal-members=true", "--skip-binary-check", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "--member-count=3", "configure-cluster", "--skip-binary-check"); err != nil {
		t.Fatal(err)
	}
	// An ID printed alone on stdout stays alone.
	if out, _, err = e.run(t, "backup-now", "--wait=false", "--etcd-bin-dir=/opt"); err != nil || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("backup-now --wait=false printed %q (%v)", out, err)
	}
	out, _, _ = e.run(t, "--help")
	if strings.Contains(out, "skip-binary-check") || strings.Contains(out, "etcd-bin-dir") {
		t.Errorf("--help shows a deprecated flag:\n%s", out)
	}
}

func TestGetErrors(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "get"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("get on a missing store: %v", err)
	}
	if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "get", "-o", "table"); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Errorf("get -o table: %v", err)
	}
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"get"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--backup-store is required") {
		t.Errorf("get without --backup-store: %v", err)
	}
}

func TestUnreachableStoreIsRetried(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--backup-store=file://" + file + "/store", "--store-attempts=2", "get"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "tried 2 times") {
		t.Errorf("err = %v", err)
	}
}

func TestReplaceMalformedSpec(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(strings.TrimPrefix(e.store, "file://"), "control", "etcd-cluster-spec")
	if err := os.WriteFile(path, []byte("{junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "get"); err == nil || !strings.Contains(err.Error(), "control/etcd-cluster-spec") {
		t.Errorf("get of junk spec: %v", err)
	}
	if _, _, err := e.run(t, "--member-count=3", "configure-cluster"); err == nil {
		t.Error("a partial update over a junk spec was accepted")
	}
	_, stderr, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "configure-cluster")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "replacing the unreadable spec") {
		t.Errorf("stderr %q", stderr)
	}
}

// --allow-dump-restore goes with the version it allows: it is refused on
// its own, kept by a change of member count, and dropped by the next
// version change that does not repeat it.
func TestAllowDumpRestore(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.run(t, "--allow-dump-restore", "configure-cluster")
	if err == nil || !strings.Contains(err.Error(), "--allow-dump-restore goes with the --etcd-version it allows") {
		t.Fatalf("--allow-dump-restore alone: %v", err)
	}
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"--etcd-version=3.5.35", "--allow-dump-restore"}, "memberCount: 3\netcdVersion: 3.5.35\nallowDumpRestore: true\ncompaction: keep 1h of history (the default)\n"},
		{[]string{"--member-count=5"}, "memberCount: 5\netcdVersion: 3.5.35\nallowDumpRestore: true\ncompaction: keep 1h of history (the default)\n"},
		{[]string{"--etcd-version=3.6.16"}, "memberCount: 5\netcdVersion: 3.6.16\ncompaction: keep 1h of history (the default)\n"},
		// The operator's flag is kept until it is given again.
		{[]string{"--member-count=3", "--ordinal-members"}, "memberCount: 3\netcdVersion: 3.6.16\nordinalMembers: true\ncompaction: keep 1h of history (the default)\n"},
		{[]string{"--member-count=5"}, "memberCount: 5\netcdVersion: 3.6.16\nordinalMembers: true\ncompaction: keep 1h of history (the default)\n"},
		{[]string{"--member-count=5", "--ordinal-members=false"}, "memberCount: 5\netcdVersion: 3.6.16\ncompaction: keep 1h of history (the default)\n"},
	}
	for _, s := range steps {
		if _, _, err := e.run(t, append(s.args, "configure-cluster")...); err != nil {
			t.Fatalf("%v: %v", s.args, err)
		}
		if out, _, err := e.run(t, "get"); err != nil || out != s.want {
			t.Fatalf("after %v, get printed %q (%v), want %q", s.args, out, err, s.want)
		}
	}
}

// The compaction policy is set in etcd's terms, kept by other changes,
// and a change of mode must say what its retention now means.
func TestConfigureCompaction(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		args    []string
		want    string // get's compaction line
		wantErr string
	}{
		{args: []string{"--auto-compaction-retention=30m"}, want: "keep 30m of history"},
		{args: []string{"--auto-compaction-retention=72"}, want: "keep 72h of history"},
		{args: []string{"--member-count=5"}, want: "keep 72h of history"},
		{args: []string{"--auto-compaction-mode=periodic"}, want: "keep 72h of history"}, // the mode it had
		{args: []string{"--auto-compaction-mode=revision"}, wantErr: `changes what the retention "72" means`},
		{args: []string{"--auto-compaction-mode=revision", "--auto-compaction-retention=10000"}, want: "keep 10000 revisions"},
		{args: []string{"--auto-compaction-retention=0"}, want: "never compact"},
		{args: []string{"--auto-compaction-mode=periodic", "--auto-compaction-retention=2h30m"}, want: "keep 2h30m of history"},
	}
	for _, s := range steps {
		_, _, err := e.run(t, append(s.args, "configure-cluster")...)
		if s.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), s.wantErr) {
				t.Fatalf("%v: err = %v, want it to mention %q", s.args, err, s.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", s.args, err)
		}
		out, _, err := e.run(t, "get")
		if err != nil || !strings.Contains(out, "\ncompaction: "+s.want+"\n") {
			t.Fatalf("after %v, get printed %q (%v), want compaction: %s", s.args, out, err, s.want)
		}
	}
	out, _, err := e.run(t, "get", "-o", "json")
	if err != nil || !strings.Contains(out, `"autoCompactionMode": "periodic"`) || !strings.Contains(out, `"autoCompactionRetention": "2h30m"`) {
		t.Errorf("get -o json printed %q (%v)", out, err)
	}
	// Empty values remove the fields (for a spec kops must read again).
	if _, _, err := e.run(t, "--auto-compaction-mode=", "--auto-compaction-retention=", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	out, _, err = e.run(t, "get", "-o", "json")
	if err != nil || strings.Contains(out, "autoCompaction") {
		t.Errorf("after removing the policy, get -o json printed %q (%v)", out, err)
	}
}

// Settings are set, kept when left out, and removed by an empty value.
func TestConfigureSettings(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "--snapshot-count=50000", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	out, _, err := e.run(t, "--quota-backend-bytes=8589934592", "configure-cluster")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "etcdSettings=[quota-backend-bytes=8589934592 snapshot-count=50000]") {
		t.Errorf("configure-cluster printed %q", out)
	}
	if _, _, err := e.run(t, "--snapshot-count=", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	out, _, err = e.run(t, "get")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "etcdSettings: quota-backend-bytes=8589934592\n") {
		t.Errorf("get printed %q", out)
	}
	if _, _, err := e.run(t, "--quota-backend-bytes=", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	if out, _, _ = e.run(t, "get", "-o", "json"); strings.Contains(out, "etcdSettings") {
		t.Errorf("no settings left, yet get -o json printed %q", out)
	}
	// A version the settings do not fit is refused with them.
	if _, _, err := e.run(t, "--warning-apply-duration=1s", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "--etcd-version=3.5.35", "configure-cluster"); err == nil || !strings.Contains(err.Error(), "unknown to etcd 3.5.35") {
		t.Errorf("a version change the settings do not fit: %v", err)
	}
}

// The defrag policy is set flag by flag; the rest keep their values.
func TestConfigureDefragPolicy(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "--defrag-window=0 3 * * *", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "--defrag-min-reclaimable-bytes=1048576", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	out, _, err := e.run(t, "get")
	if err != nil {
		t.Fatal(err)
	}
	if want := `defrag: when 1048576 bytes or more are free and 50% of the database, or it is at 80% of the quota; within 1h0m0s of "0 3 * * *" (UTC)`; !strings.Contains(out, want) {
		t.Errorf("get printed %q, want %q", out, want)
	}
	if _, _, err := e.run(t, "--auto-defrag=false", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	if out, _, _ = e.run(t, "get"); !strings.Contains(out, "defrag: off") {
		t.Errorf("get printed %q", out)
	}
}

func TestPrintMaintenance(t *testing.T) {
	at := time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		m    *peer.Maintenance
		want []string
	}{
		{"none", nil, nil},
		{"alarms only", &peer.Maintenance{Alarms: []string{"NOSPACE 1a"}}, []string{"etcd alarms: NOSPACE 1a"}},
		{"everything", &peer.Maintenance{
			LastDefrag:    &peer.DefragRecord{Node: "b", At: at, Duration: 1500 * time.Millisecond, SizeBefore: 500 << 20, SizeAfter: 100 << 20, Isolated: true},
			LastHashCheck: &peer.HashCheckRecord{At: at, Revision: 42, Outcome: "mismatch"},
			LastDiscard:   &peer.DiscardRecord{Node: "c", At: at, Reason: "its HashKV differs"},
		}, []string{
			"last defragmentation: b (isolated) at 2026-11-23T03:00:00Z, took 1.5s, database 500.0 MiB -> 100.0 MiB",
			"last hash comparison: mismatch at revision 42, 2026-11-23T03:00:00Z",
			"last member rebuilt for disagreeing data: c at 2026-11-23T03:00:00Z (its HashKV differs)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			printMaintenance(&b, tt.m)
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			if tt.want == nil && b.Len() != 0 {
				t.Errorf("output %q, want none", b.String())
			}
		})
	}
}

// A command line that cannot work fails at once with exit status 2 and
// says what to do; a store that cannot be reached is status 1.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantMsg  []string
	}{
		{name: "unknown store scheme", args: []string{"--backup-store=ftp://host/backups", "--store-attempts=5", "get"}, wantCode: exitUsage,
			wantMsg: []string{`"ftp://host/backups"`, `unsupported scheme "ftp"`, "file, s3, gs, azblob", "s3://bucket/prefix"}},
		{name: "unknown store scheme, before a queue command", args: []string{"--backup-store=ftp://host/backups", "backup-now"}, wantCode: exitUsage, wantMsg: []string{`unsupported scheme "ftp"`}},
		{name: "store URL without a scheme", args: []string{"--backup-store=/var/backups", "get"}, wantCode: exitUsage, wantMsg: []string{"missing scheme"}},
		{name: "no store", args: []string{"get"}, wantCode: exitUsage, wantMsg: []string{"--backup-store is required"}},
		{name: "unknown command", args: []string{"--backup-store=file:///x", "restore"}, wantCode: exitUsage, wantMsg: []string{`unknown command "restore"`, "--help"}},
		{name: "unknown flag", args: []string{"--backup-store=file:///x", "get", "--colour"}, wantCode: exitUsage, wantMsg: []string{"unknown flag: --colour", "etcd-manager-ctl get --help"}},
		{name: "an argument too many", args: []string{"--backup-store=file:///x", "get", "spec"}, wantCode: exitUsage, wantMsg: []string{"etcd-manager-ctl get: unknown command \"spec\""}},
		{name: "member count zero", args: []string{"--backup-store=file:///x", "--member-count=0", "configure-cluster"}, wantCode: exitUsage, wantMsg: []string{"member count must be at least 1"}},
		{name: "another command's flag", args: []string{"--backup-store=file:///x", "--quota-backend-bytes=1", "list-backups"}, wantCode: exitUsage,
			wantMsg: []string{"etcd-manager-ctl list-backups takes no --quota-backend-bytes: it is a flag of etcd-manager-ctl configure-cluster"}},
		{name: "another command's flag, after the name", args: []string{"--backup-store=file:///x", "get", "--member-count=3"}, wantCode: exitUsage,
			wantMsg: []string{"get takes no --member-count: it is a flag of etcd-manager-ctl configure-cluster"}},
		{name: "unreachable store", args: []string{"--backup-store=file://" + blocker + "/store", "--store-attempts=1", "get"}, wantCode: exitFailed, wantMsg: []string{"unreachable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			var out, errOut bytes.Buffer
			err := run(t.Context(), tt.args, &out, &errOut)
			if err == nil {
				t.Fatal("no error")
			}
			if took := time.Since(start); took > 400*time.Millisecond {
				t.Errorf("took %s: a usage error must not be retried", took)
			}
			if got := exitCode(err); got != tt.wantCode {
				t.Errorf("exit status %d, want %d (err %v)", got, tt.wantCode, err)
			}
			for _, want := range tt.wantMsg {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err %q does not mention %q", err, want)
				}
			}
		})
	}
	// Help is no error, and documents the statuses.
	for _, args := range [][]string{{"--help"}, {"help"}, {"help", "get"}} {
		var out, errOut bytes.Buffer
		if err := run(t.Context(), args, &out, &errOut); err != nil {
			t.Errorf("%v: %v", args, err)
		}
		if args[0] == "--help" && (!strings.Contains(out.String(), "Exit status:\n  0  done;\n  1  the command could not do its work") ||
			!strings.Contains(out.String(), "3  --wait timed out while the command it waited for stays queued")) {
			t.Errorf("--help does not document the exit status:\n%s", out.String())
		}
	}
}

// plantBackup writes the objects of a backup into the env's store; an
// object whose content is nil is left out.
func (e ctlEnv) plantBackup(t *testing.T, name string, meta, data []byte) {
	t.Helper()
	dir := filepath.Join(e.storeDir(), name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for object, content := range map[string][]byte{"_etcd_backup.meta": meta, "etcd.backup.gz": data} {
		if content == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, object), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// restore-backup refuses at once, naming it, a backup no restore could
// use, and queues nothing; a whole one is queued.
func TestRestoreBackupRefusesWhatCannotBeRestored(t *testing.T) {
	const name = "2026-11-22T05:00:00Z-000001"
	meta := []byte(`{"etcdVersion":"3.6.16","timestamp":"1795410000"}`)
	tests := []struct {
		name       string
		meta, data []byte
		arg        string
		wantErr    []string
		wantQueued bool
	}{
		{name: "not in the store", arg: name, wantErr: []string{`no backup "` + name + `" in file://`, "list-backups prints the backups a restore can use", "nothing was queued"}},
		{name: "not a backup's name", arg: "yesterday", wantErr: []string{`no backup "yesterday"`, "list-backups"}},
		{name: "a path", arg: "../" + name, wantErr: []string{`no backup "../` + name + `"`}},
		{name: "no meta", data: []byte("gz"), arg: name, wantErr: []string{"backup " + name + " in file://", "is not whole: it has no _etcd_backup.meta", "list-backups prints the complete backups"}},
		{name: "no data", meta: meta, arg: name, wantErr: []string{"is not whole: it has no etcd.backup.gz"}},
		{name: "junk meta", meta: []byte("{junk"), data: []byte("gz"), arg: name, wantErr: []string{"backup " + name + " cannot be restored", "_etcd_backup.meta is not valid JSON"}},
		{name: "whole", meta: meta, data: []byte("gz"), arg: name, wantQueued: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			if tt.meta != nil || tt.data != nil {
				e.plantBackup(t, name, tt.meta, tt.data)
			}
			// Without --wait=false, a queued restore would wait for 30 minutes.
			args := []string{"restore-backup", "--", tt.arg}
			if tt.wantQueued {
				args = []string{"restore-backup", "--wait=false", tt.arg}
			}
			start := time.Now()
			out, _, err := e.run(t, args...)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %s", took)
			}
			if tt.wantQueued {
				if err != nil {
					t.Fatal(err)
				}
				if list, _, _ := e.run(t, "list-commands"); !strings.Contains(list, strings.TrimSpace(out)) || !strings.Contains(list, "backup "+name) {
					t.Errorf("list-commands printed %q, want the queued restore %q", list, out)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err %q does not mention %q", err, want)
				}
			}
			if exitCode(err) != exitFailed {
				t.Errorf("exit status %d", exitCode(err))
			}
			if list, _, _ := e.run(t, "list-commands", "-o", "json"); strings.TrimSpace(list) != "[]" {
				t.Errorf("a refused restore queued a command: %s", list)
			}
		})
	}
}

// get shows a stored spec the agents refuse, then says why, and exits
// with status 1; a valid spec's warnings go to stderr.
func TestGetInvalidSpec(t *testing.T) {
	tests := []struct {
		name        string
		spec        string
		wantOut     string // on stdout, in text
		wantErr     string
		wantWarning string
	}{
		{name: "member count zero", spec: `{"memberCount":0,"etcdVersion":"3.6.16"}`, wantOut: "memberCount: 0\n", wantErr: "member count must be at least 1 (got 0)"},
		{name: "negative member count", spec: `{"memberCount":-1,"etcdVersion":"3.6.16"}`, wantOut: "memberCount: -1\n", wantErr: "member count must be at least 1 (got -1)"},
		{name: "no version", spec: `{"memberCount":3}`, wantOut: "etcdVersion: \n", wantErr: "etcd version is required"},
		{name: "unparsable version", spec: `{"memberCount":3,"etcdVersion":"3.six"}`, wantOut: "etcdVersion: 3.six\n", wantErr: "invalid etcd version"},
		{name: "etcd v2", spec: `{"memberCount":3,"etcdVersion":"2.2.1"}`, wantOut: "etcdVersion: 2.2.1\n", wantErr: "etcd v2 is not supported"},
		{name: "a malformed setting", spec: `{"memberCount":3,"etcdVersion":"3.6.16","etcdSettings":{"quota-backend-bytes":"8GiB"}}`, wantOut: "etcdSettings: quota-backend-bytes=8GiB\n", wantErr: "want a whole number"},
		{name: "a bad compaction", spec: `{"memberCount":3,"etcdVersion":"3.6.16","autoCompactionMode":"hourly"}`, wantOut: "compaction: invalid", wantErr: `mode "hourly"`},
		{name: "an even count is only a warning", spec: `{"memberCount":4,"etcdVersion":"3.6.16"}`, wantOut: "memberCount: 4\n", wantWarning: "even member count (4)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(e.storeDir(), "control", "etcd-cluster-spec"), []byte(tt.spec), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, output := range []string{"text", "json"} {
				out, stderr, err := e.run(t, "get", "-o", output)
				if output == "text" && !strings.Contains(out, tt.wantOut) {
					t.Errorf("get printed %q, want it to show %q", out, tt.wantOut)
				}
				if output == "json" && !strings.Contains(out, `"memberCount"`) {
					t.Errorf("get -o json printed %q, want the spec", out)
				}
				if tt.wantErr == "" {
					if err != nil {
						t.Fatalf("-o %s: %v", output, err)
					}
					if !strings.Contains(stderr, "warning: an "+tt.wantWarning) {
						t.Errorf("-o %s: stderr %q lacks the warning %q", output, stderr, tt.wantWarning)
					}
					continue
				}
				if err == nil {
					t.Fatalf("-o %s: get of an invalid spec succeeded", output)
				}
				for _, want := range []string{"the cluster spec in " + e.store + " (control/etcd-cluster-spec) is invalid: ", tt.wantErr, "configure-cluster"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("-o %s: err %q does not mention %q", output, err, want)
					}
				}
				if exitCode(err) != exitFailed {
					t.Errorf("exit status %d, want %d", exitCode(err), exitFailed)
				}
			}
		})
	}
}

// A member count set with --force stays through other changes, with its
// warning; setting it again needs --force again.
func TestForcedMemberCountIsKept(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=11", "--etcd-version=3.6.16", "--force", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := e.run(t, "--etcd-version=3.5.35", "configure-cluster")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "warning: a member count of 11 is above 9") {
		t.Errorf("stderr %q lacks the warning", stderr)
	}
	if out, stderr, err := e.run(t, "get"); err != nil || !strings.Contains(out, "memberCount: 11\n") || !strings.Contains(stderr, "above 9") {
		t.Errorf("get printed %q, %q (%v)", out, stderr, err)
	}
	if _, _, err := e.run(t, "--member-count=13", "configure-cluster"); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("a larger count without --force: %v", err)
	}
}

// version and --version print the ctl's build, and need no store.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		if err := run(t.Context(), args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v: %s", args, err, errOut.String())
		}
		if got := out.String(); !strings.HasPrefix(got, "etcd-manager-ctl ") || !strings.Contains(got, runtime.Version()) {
			t.Errorf("%v printed %q, want the ctl's version and its Go", args, got)
		}
	}
}

// An output format the ctl does not know is a usage error, whatever the
// command; -w is etcdctl's spelling of -o.
func TestOutputFormat(t *testing.T) {
	e := newCtlEnv(t)
	for _, args := range [][]string{{"-o", "xml", "list-commands"}, {"--output=xml", "get"}, {"-w", "table", "status"}, {"-o", "toml", "version"}, {"-o", "JSON", "backup-now"}} {
		_, _, err := e.run(t, args...)
		if exitCode(err) != exitUsage || !strings.Contains(fmt.Sprint(err), "use text, json or yaml") {
			t.Errorf("%v: %v (exit %d), want a usage error", args, err, exitCode(err))
		}
	}
	out, _, err := e.run(t, "-w", "json", "version")
	if err != nil || !strings.Contains(out, `"goVersion"`) {
		t.Errorf("-w json version: %q, %v", out, err)
	}
}
