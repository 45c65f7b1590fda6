package flags

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/etcd-manager/etcd-manager/internal/agent"
	"github.com/etcd-manager/etcd-manager/internal/backupagent"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
	"github.com/etcd-manager/etcd-manager/internal/operator"
)

func TestNormalize(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("member-count", 0, "")
	fs.String("backup-store", "", "")
	fs.BoolP("verbose", "v", false, "")
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{name: "walkthrough spelling",
			in:   []string{"-member-count=1", "--backup-store=file:///tmp/x", "-etcd-version=3.6.16", "configure-cluster"},
			want: []string{"--member-count=1", "--backup-store=file:///tmp/x", "-etcd-version=3.6.16", "configure-cluster"}},
		{name: "single dash with separate value", in: []string{"-backup-store", "file:///x", "get"}, want: []string{"--backup-store", "file:///x", "get"}},
		{name: "shorthand untouched", in: []string{"-v"}, want: []string{"-v"}},
		{name: "after double dash untouched", in: []string{"--", "-member-count=1"}, want: []string{"--", "-member-count=1"}},
		{name: "positional untouched", in: []string{"restore-backup", "2019-01-14T15:29:48Z-000003"}, want: []string{"restore-backup", "2019-01-14T15:29:48Z-000003"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Normalize(fs, tt.in)
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// Every flag of every command has real help, and the flags that error
// messages name exist.
func TestFlagsHaveHelp(t *testing.T) {
	agentCfg := agent.Default()
	backupAgent := backupagent.Default()
	op := operator.Default()
	logCfg := cli.DefaultLogConfig()
	sets := map[string]*pflag.FlagSet{}
	for name, add := range map[string]func(*pflag.FlagSet){
		"agent":        func(fs *pflag.FlagSet) { Agent(fs, &agentCfg); Log(fs, &logCfg) },
		"backup-agent": func(fs *pflag.FlagSet) { BackupAgent(fs, &backupAgent); Log(fs, &logCfg) },
		"operator":     func(fs *pflag.FlagSet) { Operator(fs, &op); Log(fs, &logCfg) },
	} {
		fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
		add(fs)
		sets[name] = fs
		n := 0
		fs.VisitAll(func(f *pflag.Flag) {
			n++
			if len(f.Usage) < 10 {
				t.Errorf("%s: --%s has no real help text: %q", name, f.Name, f.Usage)
			}
		})
		if n < 10 {
			t.Errorf("%s: only %d flags", name, n)
		}
	}
	for _, name := range []string{"insecure", "etcd-insecure", "address", "etcd-address", "cluster-name", "data-dir", "etcd-bin-dir", "peer-port",
		controller.FlagBackupStore, agent.FlagEtcdInsecure, agent.FlagInsecure, agent.FlagClientURLs,
		agent.FlagQuarantineClientURLs, agent.FlagPeerURLs, agent.FlagListenPeerURLs, agent.FlagListenClientURLs,
		backupjob.FlagEncryptionKeyFile, backupjob.FlagDecryptionKeyFiles, "capture", "compaction-interval", "log-level"} {
		if sets["agent"].Lookup(name) == nil {
			t.Errorf("agent: flag --%s is missing", name)
		}
	}
	if got := sets["agent"].Lookup("etcd-bin-dir").DefValue; got != "/opt" {
		t.Errorf("--etcd-bin-dir default = %q, want /opt", got)
	}
}

// The key flags exist on the managing agent and the backup agent alike,
// and parse as documented: one encryption key, decryption keys repeated.
func TestKeyFlags(t *testing.T) {
	dir := t.TempDir()
	cur, curID := crypttest.KeyFile(t, dir, "current.key")
	old1, old1ID := crypttest.KeyFile(t, dir, "old1.key")
	old2, old2ID := crypttest.KeyFile(t, dir, "old2.key")
	args := []string{"--backup-encryption-key-file=" + cur, "--backup-decryption-key-file=" + old1, "--backup-decryption-key-file", old2}

	agentCfg := agent.Default()
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	Agent(fs, &agentCfg)
	backupAgent := backupagent.Default()
	bfs := pflag.NewFlagSet("backup-agent", pflag.ContinueOnError)
	BackupAgent(bfs, &backupAgent)
	for name, set := range map[string]struct {
		fs  *pflag.FlagSet
		cfg *backupjob.Config
	}{"agent": {fs, &agentCfg.Backup}, "backup-agent": {bfs, &backupAgent.Backup}} {
		for _, f := range []string{backupjob.FlagEncryptionKeyFile, backupjob.FlagDecryptionKeyFiles} {
			if fl := set.fs.Lookup(f); fl == nil || len(fl.Usage) < 20 {
				t.Fatalf("%s: --%s is missing or has no help", name, f)
			}
		}
		if err := set.fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		keys, err := set.cfg.Keyring()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := keys.IDs(), []string{curID, old1ID, old2ID}; !slices.Equal(got, want) || keys.WriteKeyID() != curID {
			t.Errorf("%s: keys %v writing with %s, want %v writing with %s", name, got, keys.WriteKeyID(), want, curID)
		}
	}
}

// Every flag of the systemd environment file, with those the unit adds,
// is one the agent knows and takes.
func TestSystemdEnvFileFlags(t *testing.T) {
	const dir = "../../../deploy/systemd/"
	data, err := os.ReadFile(dir + "etcd-manager.env")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	var flags []string
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "ETCD_MANAGER_FLAGS="); ok {
			flags = strings.Fields(v)
		}
	}
	if len(flags) < 5 {
		t.Fatalf("ETCD_MANAGER_FLAGS holds %d flags", len(flags))
	}
	unitData, err := os.ReadFile(dir + "etcd-manager@.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ExecStart=\S+ (.*) \$ETCD_MANAGER_FLAGS$`).FindStringSubmatch(string(unitData))
	if m == nil {
		t.Fatal("ExecStart does not end with $ETCD_MANAGER_FLAGS")
	}
	args := append(strings.Fields(strings.ReplaceAll(m[1], "%i", "main")), flags...)
	cfg := agent.Default()
	logCfg := cli.DefaultLogConfig()
	fs := pflag.NewFlagSet("etcd-manager", pflag.ContinueOnError)
	Agent(fs, &cfg)
	Log(fs, &logCfg)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the agent refuses the flags %v: %v", args, err)
	}
	if fs.NArg() != 0 {
		t.Errorf("words that are not flags: %v", fs.Args())
	}
	if cfg.ClusterName != "main" || cfg.DataDir != "/var/lib/etcd-manager/main" || !strings.HasPrefix(cfg.BackupStore, "s3://") {
		t.Errorf("parsed %q, %q, %q", cfg.ClusterName, cfg.DataDir, cfg.BackupStore)
	}
}
