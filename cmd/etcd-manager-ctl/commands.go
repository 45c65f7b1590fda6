package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/etcd-manager/etcd-manager/cmd/internal/children"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
	"github.com/etcd-manager/etcd-manager/internal/version"
)

// options hold the ctl's flags. Those every command shares are persistent
// flags on the root; those of one command (configure-cluster's) are that
// command's. Either may come before or after the command name, as in the
// walkthrough: etcd-manager-ctl -member-count=1 --backup-store=... configure-cluster
type options struct {
	// stderr takes warnings, never stdout, which scripts may read.
	stderr           io.Writer
	backupStore      string
	memberCount      int32
	force            bool
	etcdVersion      string
	allowDumpRestore bool
	ordinalMembers   bool
	compactionMode   string
	compactionKeep   string
	output           string
	storeAttempts    int
	discovery        string
	clusterName      string
	peerPort         int
	insecure         bool
	pkiDir           string
	cacert           string
	cert             string
	key              string
	// settings are the etcd settings' flags, by etcd's flag name.
	settings map[string]*string
	// defragPolicy and defragAuto are the defrag policy's flags.
	defragPolicy spec.DefragPolicy
	defragAuto   bool
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	o := &options{output: "text", storeAttempts: 3, stderr: stderr}
	root := &cobra.Command{
		Use:     "etcd-manager-ctl",
		Version: version.Get().String(),
		Short:   "Operate an etcd-manager cluster through its backup store",
		Long: `etcd-manager-ctl reads and writes the backup store that etcd-manager agents
watch. The store is the source of truth whenever etcd is down, so these
commands work even then.

Exit status:
  0  done;
  1  the command could not do its work (the store unreachable or refusing
     access, a refusal, a failed command);
  2  the command line is wrong (an unknown command or flag, a flag of
     another command, a missing or malformed value, a --backup-store URL
     that cannot be used as it is), which trying again cannot help;
  3  --wait timed out while the command it waited for stays queued, or
     goes on (see list-commands).

--output json or yaml prints the command's result alone on stdout, and
its progress and warnings on stderr.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	fs := root.PersistentFlags()
	fs.StringVar(&o.backupStore, "backup-store", "", "URL of the backup store: file:///path, s3://bucket/prefix, gs://bucket/prefix or azblob://container/prefix (required)")
	for _, d := range deprecatedFlags {
		d.add(fs)
		_ = fs.MarkHidden(d.name)
	}
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		for _, d := range deprecatedFlags {
			// doctor has an --etcd-bin-dir of its own.
			if cmd.LocalNonPersistentFlags().Lookup(d.name) == nil && cmd.Flags().Changed(d.name) {
				fprintf(stderr, "warning: --%s is deprecated and does nothing: %s; drop it\n", d.name, d.why)
			}
		}
		return checkFormat(o.output)
	}
	fs.StringVarP(&o.output, "output", "o", o.output, "output format: text, json or yaml; json and yaml print the result alone on stdout, with progress and warnings on stderr")
	fs.StringVarP(&o.output, "write-out", "w", o.output, "the same as --output, as etcdctl spells it")
	fs.IntVar(&o.storeAttempts, "store-attempts", o.storeAttempts, "how many times to try an unreachable backup store before giving up")
	fs.StringVar(&o.discovery, "discovery", "store", "how to find the agents (status, and to tell them at once of a queued command or a new spec): store, file:///DIR, static:HOST:PORT,... or dns:NAME, as the agents' --discovery")
	fs.StringVar(&o.clusterName, "cluster-name", "", "cluster name the agents serve (status, and telling them of a change); taken from the discovery records when they carry it")
	fs.IntVar(&o.peerPort, "peer-port", 8000, "agents' peer API port, for --discovery=dns:NAME with A records")
	fs.BoolVar(&o.insecure, "insecure", false, "talk to the agents' peer API and etcd without TLS (status, and telling them of a change), as agents started with --insecure --etcd-insecure")
	fs.StringVar(&o.pkiDir, "pki-dir", "", "directory holding the cluster's CA (ca.crt, ca.key), as the agents' --pki-dir; by default the CA is read from the backup store's pki/ prefix")
	fs.StringVar(&o.cacert, "cacert", "", "CA certificate to trust, with --cert and --key (instead of issuing a certificate from the CA)")
	fs.StringVar(&o.cert, "cert", "", "client certificate to present to the agents and etcd, with --cacert and --key")
	fs.StringVar(&o.key, "key", "", "key of --cert")

	var ranges, watchStatus bool
	var statusInterval time.Duration
	listBackups := &cobra.Command{
		Use:   "list-backups",
		Short: "List the complete backups in the store, oldest first, one name per line",
		Long: `list-backups prints one backup per line, oldest first, with its name in the first
column. Backups whose meta object is missing (unfinished) are not listed.
--output json adds size, revision, version and age. When continuous capture has
written changes, a summary of what a restore can reach goes to stderr;
--ranges prints it in full instead: per timeline (cluster token), the earliest
and latest restorable point by revision and time, each run of captured changes
with the full backup it started from, and any gap between runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.listBackups(cmd.Context(), stdout, cmd.ErrOrStderr(), ranges)
		},
	}
	listBackups.Flags().BoolVar(&ranges, "ranges", false, "print the restorable ranges of every timeline instead of the backups")
	root.AddCommand(
		&cobra.Command{
			Use:   "get",
			Short: "Show the cluster spec: member count and etcd version",
			Args:  cobra.NoArgs,
			Long: `get prints the cluster spec the backup store holds. When the spec is invalid
(such as a member count of 0 or an etcd version this etcd-manager does not
support), it is printed all the same, then get says why it is invalid and
exits with status 1: the agents ignore an invalid spec and keep the cluster
as it is until configure-cluster corrects it.`,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return o.get(cmd.Context(), stdout, cmd.ErrOrStderr())
			},
		},
		listBackups,
		&cobra.Command{
			Use:   "status",
			Short: "Show every agent: role, etcd version, health and DB size, with the spec and the leader",
			Long: `status finds the agents through discovery (by default the records they keep in
the backup store) and asks each for its state over the peer API. It works
whenever any agent is reachable; when none answers, it shows what the store
says (the spec, the newest backup and restorable point, the last drill, the
queued commands) and fails. --watch (-W) shows it again every --interval
while it changes, until interrupted: redrawn in place on a terminal,
otherwise each new status after a line with its time.`,
			Example: "  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test --insecure status",
			Args:    cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if watchStatus {
					if statusInterval <= 0 {
						return usagef("--interval %s must be positive", statusInterval)
					}
					return o.watchStatus(cmd.Context(), stdout, statusInterval)
				}
				return o.status(cmd.Context(), stdout)
			},
		},
	)
	statusCmd, _, _ := root.Find([]string{"status"})
	statusCmd.Flags().BoolVarP(&watchStatus, "watch", "W", false, "show the status again every --interval while it changes, until interrupted")
	statusCmd.Flags().DurationVar(&statusInterval, "interval", 2*time.Second, "with --watch, how often to ask")
	var dryRun bool
	configure := &cobra.Command{
		Use:   "configure-cluster",
		Short: "Set the cluster spec: --member-count, --etcd-version, the compaction policy and etcd settings",
		Long: `configure-cluster writes the desired spec to the backup store. The agents
pick it up on their next cycle. On a store that has a spec already, a flag
left out keeps its current value.

--auto-compaction-mode and --auto-compaction-retention take etcd's own
meanings, but the agent leading etcd compacts, not etcd: it never compacts
past what continuous capture has made durable in the store, unless capture
lags past the agent's --compaction-capture-wait or the database nears its
quota (then availability wins, and a full backup follows). Without them, a
cluster keeps ` + spec.DefaultCompactionRetention + ` of history.

etcd settings take etcd's own flag names and syntax: --` + strings.Join(spec.SettingNames(), ", --") + `.
The leader rolls a change out one member at a time, followers first, moving
leadership off a member before it restarts, as for a version change. A
setting the spec's etcd version does not know is refused here. An empty
value (--quota-backend-bytes=) goes back to etcd's default.

--etcd-version is checked against the etcd versions each agent reports
installed on its node, in its record in the store: this machine needs no
etcd. A version that a node heard from in the last 10 minutes lacks is
refused, naming the node. When no node has reported (no agent runs yet, or
the agents are older than this ctl) it is accepted with a warning; the
agents refuse it, before they stop anything, if a member lacks it.

--member-count above 9 needs --force: etcd advises 3 or 5 members, 7 at
most, as every write waits for a majority of them.

--dry-run checks the change as above and prints, field by field, what the
leader would do to carry it out (which members restart, in what order, which
version steps, what is backed up first), then writes nothing. It exits 1 when
the agents would refuse the change.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test --member-count=1 --etcd-version=3.6.16 configure-cluster
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test --quota-backend-bytes=8589934592 --snapshot-count=50000 configure-cluster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.configureCluster(cmd.Context(), cmd, stdout, stderr, dryRun)
		},
	}
	cf := configure.Flags()
	cf.BoolVar(&dryRun, "dry-run", false, "check the change and print what the leader would do to carry it out (a roll, a resize, a version step), and write nothing")
	cf.Int32Var(&o.memberCount, "member-count", 0, fmt.Sprintf("number of etcd members, at most %d without --force; etcd advises 3 or 5, 7 at most", spec.MaxMemberCount))
	cf.BoolVar(&o.force, "force", false, fmt.Sprintf("let --member-count go above %d", spec.MaxMemberCount))
	cf.StringVar(&o.etcdVersion, "etcd-version", "", "etcd version to run, such as 3.6.16")
	cf.BoolVar(&o.ordinalMembers, "ordinal-members", false, "the agents are a StatefulSet's pods, named <set>-<ordinal> with --node-name: only ordinals below --member-count are members, and shrinking removes the highest ordinal first (set by the Kubernetes operator)")
	cf.BoolVar(&o.allowDumpRestore, "allow-dump-restore", false, "with --etcd-version: allow a version change no rolling change can make (such as 3.5 to 3.4) by dump and restore, which cuts clients off until the new cluster serves")
	cf.StringVar(&o.compactionMode, "auto-compaction-mode", "", "compaction policy's mode, as etcd's flag: periodic (keep a span of time) or revision (keep a count of revisions); the agent compacts, keeping behind continuous capture (default periodic)")
	cf.StringVar(&o.compactionKeep, "auto-compaction-retention", "", "compaction policy's retention, as etcd's flag: for periodic a duration such as 30m or a number of hours, for revision a number of revisions; 0 turns compaction off (default "+spec.DefaultCompactionRetention+")")
	cf.BoolVar(&o.defragAuto, "auto-defrag", true, "let the leader defragment members on its own by the defrag policy")
	cf.Int64Var(&o.defragPolicy.MinReclaimableBytes, "defrag-min-reclaimable-bytes", spec.DefaultDefragMinReclaimableBytes, "a member is due for defragmentation only when at least this many bytes of its database are free")
	cf.Float64Var(&o.defragPolicy.MinReclaimableFraction, "defrag-min-reclaimable-fraction", spec.DefaultDefragMinReclaimableFraction, "... and at least this fraction of its database is free")
	cf.IntVar(&o.defragPolicy.QuotaPercent, "defrag-quota-percent", spec.DefaultDefragQuotaPercent, "... or its database is at this percentage of the backend quota or more")
	cf.StringVar(&o.defragPolicy.Window, "defrag-window", "", "a maintenance window for defragmentation in cron syntax, in UTC, such as '0 3 * * *' (empty: any time)")
	cf.StringVar(&o.defragPolicy.WindowDuration, "defrag-window-duration", spec.DefaultDefragWindowDuration.String(), "how long each window stays open")
	o.settings = map[string]*string{}
	for _, name := range spec.SettingNames() {
		o.settings[name] = cf.String(name, "", spec.SettingHelp(name))
	}
	root.AddCommand(configure)
	root.AddCommand(queueCommands(o, stdout)...)
	root.AddCommand(issueClientCertCommand(o, stdout))
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print this etcd-manager-ctl's version (status shows each agent's)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return o.emit(stdout, version.Get(), func() error {
				return fprintf(stdout, "etcd-manager-ctl %s\n", version.Get())
			})
		},
	})
	root.AddCommand(rotateCACommand(o, stdout))
	root.AddCommand(revokeNodeCommand(o, stdout))
	root.AddCommand(fetchBackupCommand(o, stdout))
	root.AddCommand(doctorCommand(o, stdout))
	root.AddCommand(children.VerifySnapshot())
	root.AddCommand(eventsCommand(o, stdout))
	asUsage(root)
	return root
}

// deprecatedFlags no longer do anything, but are still accepted, so that
// scripts (and the Kubernetes operator, which passes --skip-binary-check)
// keep working. They are hidden from --help, and using one prints a
// warning on stderr, never on stdout, which scripts may read.
var deprecatedFlags = []struct {
	name, why string
	add       func(*pflag.FlagSet)
}{
	{name: "etcd-bin-dir", why: "the ctl runs no etcd, and configure-cluster checks a version against what the nodes report installed",
		add: func(fs *pflag.FlagSet) { fs.String("etcd-bin-dir", "", "deprecated, does nothing") }},
	{name: "skip-binary-check", why: "configure-cluster checks a version against what the nodes report installed, not this machine",
		add: func(fs *pflag.FlagSet) { fs.Bool("skip-binary-check", false, "deprecated, does nothing") }},
}

// openStore opens the backup store, retrying with backoff while it is
// unreachable.
func (o *options) openStore(ctx context.Context, create bool) (*store.Store, error) {
	if o.backupStore == "" {
		return nil, usagef("--backup-store is required, for example --backup-store=file:///tmp/etcd-manager/backups/test")
	}
	var lastErr error
	delay := 500 * time.Millisecond
	for attempt := 1; attempt <= max(o.storeAttempts, 1); attempt++ {
		s, err := store.Open(ctx, o.backupStore, store.Options{Create: create})
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, store.ErrUnreachable) || store.Permanent(err) {
			return nil, err
		}
		lastErr = err
		if attempt < o.storeAttempts {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(delay):
			}
			delay *= 2
		}
	}
	return nil, fmt.Errorf("%w (tried %d times)", lastErr, max(o.storeAttempts, 1))
}

func (o *options) get(ctx context.Context, w, stderr io.Writer) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	cs, err := s.ReadSpec(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no cluster spec in %s yet; set one with configure-cluster", o.backupStore)
	}
	if err != nil {
		return err
	}
	if err := o.emit(w, cs, func() error { return printSpec(w, cs) }); err != nil {
		return err
	}
	// A spec that decodes may still be one the agents refuse: say so,
	// and why, after showing it.
	warnings, err := cs.Validate()
	for _, warning := range warnings {
		fprintf(stderr, "warning: %s\n", warning)
	}
	if err != nil {
		return fmt.Errorf("the cluster spec in %s (%s) is invalid: %w; the agents ignore it and change nothing until it is corrected with configure-cluster (--member-count and --etcd-version together replace it)",
			o.backupStore, store.KeySpec, err)
	}
	return nil
}

// printSpec prints the spec as get shows it.
func printSpec(w io.Writer, cs spec.ClusterSpec) error {
	err := fprintf(w, "memberCount: %d\netcdVersion: %s\n", cs.MemberCount, cs.EtcdVersion)
	if err == nil && cs.AllowDumpRestore {
		_, err = fmt.Fprintln(w, "allowDumpRestore: true")
	}
	if err == nil && cs.OrdinalMembers {
		_, err = fmt.Fprintln(w, "ordinalMembers: true")
	}
	if err == nil {
		err = fprintf(w, "compaction: %s\n", describeCompaction(cs))
	}
	if err == nil && len(cs.EtcdSettings) > 0 {
		err = fprintf(w, "etcdSettings: %s\n", cs.EtcdSettings)
	}
	if err == nil && cs.Defrag != nil {
		err = fprintf(w, "defrag: %s\n", cs.Defrag)
	}
	return err
}

// describeCompaction says what the spec's compaction policy does, and
// whether it is the default.
func describeCompaction(cs spec.ClusterSpec) string {
	p, err := cs.Compaction()
	if err != nil {
		return fmt.Sprintf("invalid (%v)", err)
	}
	if cs.AutoCompactionMode == "" && cs.AutoCompactionRetention == "" {
		return p.String() + " (the default)"
	}
	return p.String()
}

func (o *options) configureCluster(ctx context.Context, cmd *cobra.Command, stdout, stderr io.Writer, dryRun bool) error {
	fs := cmd.Flags()
	countSet, versionSet := fs.Changed("member-count"), fs.Changed("etcd-version")
	modeSet, keepSet := fs.Changed("auto-compaction-mode"), fs.Changed("auto-compaction-retention")
	if o.allowDumpRestore && !versionSet {
		return usagef("--allow-dump-restore goes with the --etcd-version it allows")
	}
	defragFlags := []string{"auto-defrag", "defrag-min-reclaimable-bytes", "defrag-min-reclaimable-fraction", "defrag-quota-percent", "defrag-window", "defrag-window-duration"}
	defragSet := slices.ContainsFunc(defragFlags, fs.Changed)
	var settingsSet []string
	for _, name := range spec.SettingNames() {
		if fs.Changed(name) {
			settingsSet = append(settingsSet, name)
		}
	}
	if !countSet && !versionSet && !modeSet && !keepSet && len(settingsSet) == 0 && !defragSet {
		return usagef("configure-cluster needs --member-count, --etcd-version, --auto-compaction-mode, --auto-compaction-retention, a defrag policy flag or an etcd setting such as --quota-backend-bytes")
	}
	// Check the new values before touching the store.
	if modeSet && keepSet {
		if _, err := spec.ParseCompaction(o.compactionMode, o.compactionKeep); err != nil {
			return usageError{err}
		}
	}
	if countSet && o.memberCount < 1 {
		return usagef("--member-count=%d: %w", o.memberCount, spec.ErrInvalidMemberCount)
	}
	if countSet && o.memberCount > spec.MaxMemberCount && !o.force {
		return usagef("--member-count=%d: %w: every write waits for a majority of the members, so each one more slows writes; etcd advises 3 or 5 members, 7 at most; add --force to set it anyway",
			o.memberCount, spec.ErrTooManyMembers)
	}
	if versionSet {
		if _, err := spec.ParseSupportedVersion(o.etcdVersion); err != nil {
			return usagef("--etcd-version: %w", err)
		}
	}

	s, err := o.openStore(ctx, true)
	if err != nil {
		return err
	}
	defer s.Close()
	cs, err := s.ReadSpec(ctx)
	old, readErr := cs, err
	old.EtcdSettings = cs.EtcdSettings.Clone()
	switch {
	case errors.Is(err, store.ErrNotFound):
		if !countSet || !versionSet {
			return usagef("the store has no cluster spec yet, so configure-cluster needs both --member-count and --etcd-version")
		}
	case err != nil && (countSet && versionSet):
		// Replacing a broken spec is how an operator repairs it.
		fprintf(stderr, "warning: replacing the unreadable spec in the store: %v\n", err)
	case err != nil:
		return fmt.Errorf("%w; pass both --member-count and --etcd-version to replace it", err)
	}
	// The nodes are checked for a version the spec does not ask for yet:
	// the operator passes the version it already runs with every change.
	newVersion := versionSet && cs.EtcdVersion != o.etcdVersion
	if countSet {
		cs.MemberCount = o.memberCount
	}
	if versionSet {
		// The permission goes with the version it was given for.
		cs.EtcdVersion, cs.AllowDumpRestore = o.etcdVersion, o.allowDumpRestore
	}
	if fs.Changed("ordinal-members") {
		cs.OrdinalMembers = o.ordinalMembers
	}
	if modeSet {
		// A retention means one thing per mode: 500 revisions are not
		// 500 hours.
		modeOf := func(m string) string {
			if m == "" {
				return spec.CompactionPeriodic
			}
			return m
		}
		if !keepSet && cs.AutoCompactionRetention != "" && modeOf(o.compactionMode) != modeOf(cs.AutoCompactionMode) {
			return usagef("--auto-compaction-mode=%s changes what the retention %q means; pass --auto-compaction-retention too", o.compactionMode, cs.AutoCompactionRetention)
		}
		cs.AutoCompactionMode = o.compactionMode
	}
	if keepSet {
		cs.AutoCompactionRetention = o.compactionKeep
	}
	if len(settingsSet) > 0 {
		cs.EtcdSettings = cs.EtcdSettings.Clone()
		for _, name := range settingsSet {
			if v := strings.TrimSpace(*o.settings[name]); v != "" {
				if cs.EtcdSettings == nil {
					cs.EtcdSettings = spec.Settings{}
				}
				cs.EtcdSettings[name] = v
			} else {
				delete(cs.EtcdSettings, name)
			}
		}
		if len(cs.EtcdSettings) == 0 {
			cs.EtcdSettings = nil
		}
	}
	if defragSet {
		// An unset threshold takes its default, so 0 cannot mean "any".
		if (fs.Changed("defrag-min-reclaimable-bytes") && o.defragPolicy.MinReclaimableBytes <= 0) ||
			(fs.Changed("defrag-min-reclaimable-fraction") && o.defragPolicy.MinReclaimableFraction <= 0) ||
			(fs.Changed("defrag-quota-percent") && o.defragPolicy.QuotaPercent <= 0) {
			return usagef("--defrag-min-reclaimable-bytes, --defrag-min-reclaimable-fraction and --defrag-quota-percent must be above 0; --auto-defrag=false turns the policy off")
		}
		p := cs.Defrag.Effective()
		if fs.Changed("auto-defrag") {
			p.Off = !o.defragAuto
		}
		if fs.Changed("defrag-min-reclaimable-bytes") {
			p.MinReclaimableBytes = o.defragPolicy.MinReclaimableBytes
		}
		if fs.Changed("defrag-min-reclaimable-fraction") {
			p.MinReclaimableFraction = o.defragPolicy.MinReclaimableFraction
		}
		if fs.Changed("defrag-quota-percent") {
			p.QuotaPercent = o.defragPolicy.QuotaPercent
		}
		if fs.Changed("defrag-window") {
			p.Window = strings.TrimSpace(o.defragPolicy.Window)
		}
		if fs.Changed("defrag-window-duration") {
			p.WindowDuration = o.defragPolicy.WindowDuration
		}
		if p.Window == "" {
			p.WindowDuration = ""
		}
		cs.Defrag = &p
	}
	warnings, err := cs.Validate()
	if err != nil {
		return err
	}
	if newVersion {
		if err := checkInstalled(ctx, s, o.etcdVersion, time.Now(), stderr); err != nil {
			return err
		}
	}
	for _, w := range warnings {
		fprintf(stderr, "warning: %s\n", w)
	}
	if dryRun {
		var current *spec.ClusterSpec
		if readErr == nil {
			current = &old
		}
		return o.emitSpecPlan(stdout, current, cs, installedOnAll(ctx, s, time.Now()))
	}
	if err := s.WriteSpec(ctx, cs); err != nil {
		return err
	}
	o.nudge(ctx, s) // the agents read the spec at once
	return o.emit(stdout, specResult{BackupStore: o.backupStore, Spec: cs}, func() error {
		return fprintf(stdout, "cluster spec set in %s: %s\n", o.backupStore, cs)
	})
}

func (o *options) listBackups(ctx context.Context, w, info io.Writer, ranges bool) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if ranges {
		return o.listRanges(ctx, s, w)
	}
	defer func() {
		if !o.structured() {
			summarizeRanges(ctx, s, info)
		}
	}()
	rows, err := storeops.BackupRows(ctx, s, time.Now())
	if err != nil {
		return err
	}
	return o.emit(w, rows, func() error {
		for _, r := range rows {
			if _, err := fmt.Fprintln(w, r.Name); err != nil {
				return err
			}
		}
		return nil
	})
}

// specResult is what configure-cluster reports: the spec it wrote.
type specResult struct {
	BackupStore string           `json:"backupStore"`
	Spec        spec.ClusterSpec `json:"spec"`
}

// specPlan is what configure-cluster --dry-run reports.
type specPlan struct {
	DryRun      bool              `json:"dryRun"`
	BackupStore string            `json:"backupStore"`
	Current     *spec.ClusterSpec `json:"current"`
	Spec        spec.ClusterSpec  `json:"spec"`
	Changes     []plan.SpecChange `json:"changes"`
}

// emitSpecPlan reports what writing next over cur would make the leader
// do, and fails when the agents would refuse it.
func (o *options) emitSpecPlan(w io.Writer, cur *spec.ClusterSpec, next spec.ClusterSpec, installed []spec.Version) error {
	changes := plan.SpecChanges(cur, next, installed)
	err := o.emit(w, specPlan{DryRun: true, BackupStore: o.backupStore, Current: cur, Spec: next, Changes: nonNil(changes)}, func() error {
		fprintf(w, "dry run: configure-cluster would set the cluster spec in %s to %s; nothing was written\n", o.backupStore, next)
		if len(changes) == 0 {
			fprintf(w, "no change: the store holds this spec already\n")
		}
		for _, c := range changes {
			verdict := ""
			if c.Refused {
				verdict = "REFUSED by the agents: "
			}
			fprintf(w, "  %s %s -> %s: %s%s\n", c.Field, dash(c.From), c.To, verdict, c.How)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, c := range changes {
		if c.Refused {
			return fmt.Errorf("configure-cluster --dry-run: the agents would refuse the %s change: %s", c.Field, c.How)
		}
	}
	return nil
}
