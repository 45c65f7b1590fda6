package flags

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/etcd-manager/etcd-manager/internal/agent"
	"github.com/etcd-manager/etcd-manager/internal/backupagent"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/operator"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// Agent registers the agent's flags on fs, bound to c; c's values are their defaults.
func Agent(fs *pflag.FlagSet, c *agent.Config) {
	fs.StringVar(&c.ClusterName, "cluster-name", c.ClusterName, "name of the etcd cluster (for example main or events); agents of other clusters are ignored")
	fs.StringVar(&c.BackupStore, controller.FlagBackupStore, c.BackupStore, "URL of the backup store, the source of truth when etcd is down: file:///path, s3://bucket/prefix, gs://bucket/prefix or azblob://container/prefix")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this node's ID and etcd member name when its data dir is new, such as a StatefulSet pod's name (default: a random ID); a data dir keeps the ID it was created with")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for this node's state and etcd data; it must survive restarts")
	fs.StringVar(&c.Address, "address", c.Address, "IP address the agent's peer API listens on and advertises")
	fs.IntVar(&c.PeerPort, "peer-port", c.PeerPort, "port of the agent's peer API")
	fs.StringVar(&c.PeerAPIListenAddress, "peer-api-listen-address", c.PeerAPIListenAddress, "host:port the agent's peer API binds when it differs from the --address and --peer-port it advertises, as behind NAT or a proxy (default: those)")
	fs.StringVar(&c.EtcdAddress, "etcd-address", c.EtcdAddress, "IP address etcd listens on; used to fill in --client-urls, --quarantine-client-urls and --peer-urls when they are not given")
	fs.StringSliceVar(&c.ClientURLs, agent.FlagClientURLs, c.ClientURLs, fmt.Sprintf("URLs etcd serves clients on (default https://<etcd-address>:%d, http:// with --etcd-insecure)", agent.DefaultClientPort))
	fs.StringSliceVar(&c.ListenClientURLs, agent.FlagListenClientURLs, c.ListenClientURLs, "URLs etcd binds for clients when they differ from the --client-urls it advertises, such as https://0.0.0.0:4001 to serve a pod's loopback too (default: the --client-urls); while quarantined etcd binds only the --quarantine-client-urls")
	fs.StringSliceVar(&c.QuarantineClientURLs, agent.FlagQuarantineClientURLs, c.QuarantineClientURLs, fmt.Sprintf("URLs etcd serves on while quarantined, so that ordinary clients cannot reach it (default https://<etcd-address>:%d, http:// with --etcd-insecure)", agent.DefaultQuarantinePort))
	fs.StringSliceVar(&c.PeerURLs, agent.FlagPeerURLs, c.PeerURLs, fmt.Sprintf("URLs etcd uses for raft traffic with its peers (default https://<etcd-address>:%d, http:// with --etcd-insecure)", agent.DefaultEtcdPeerPort))
	fs.StringSliceVar(&c.ListenPeerURLs, agent.FlagListenPeerURLs, c.ListenPeerURLs, "URLs etcd binds for raft traffic when they differ from the --peer-urls it advertises, as behind NAT or a proxy (default: the --peer-urls)")
	fs.BoolVar(&c.Insecure, agent.FlagInsecure, c.Insecure, "run the agents' peer API without TLS; by default it uses mutual TLS with certificates from the cluster's CA")
	fs.BoolVar(&c.EtcdInsecure, agent.FlagEtcdInsecure, c.EtcdInsecure, "run etcd's client and peer URLs over plain http; by default they are https and require client certificates from the cluster's CA")
	fs.BoolVar(&c.EtcdPeerCertCheck, "etcd-peer-cert-check", c.EtcdPeerCertCheck, "let the leader make etcd's peer port accept only node certificates (the name "+pki.NodeMarker("<cluster-name>")+", which no operator's certificate carries), once every member's agent has one; false on any agent turns the check off for the whole cluster, one member at a time, as before a downgrade to an etcd-manager without it")
	fs.StringVar(&c.PKIDir, "pki-dir", c.PKIDir, "directory holding the cluster's CA as ca.crt and ca.key; when empty, the CA is generated once and kept in the backup store under pki/ (guard that prefix as you would the key)")
	fs.StringVar(&c.PeerAcceptUnmarkedUntil, "peer-accept-unmarked-until", c.PeerAcceptUnmarkedUntil, fmt.Sprintf("let node certificates that carry no cluster marker (%s), issued by an etcd-manager from before markers, change this node until this RFC 3339 time, at most %s ahead, while the cluster's agents are upgraded; by default only this cluster's node certificates may", pki.NodeMarker("<cluster-name>"), agent.MaxUnmarkedWindow))
	fs.StringSliceVar(&c.CertNames, "cert-names", c.CertNames, "more DNS names and IP addresses for the node certificate, comma separated, such as the names clients dial (the operator passes its Services' names)")
	fs.StringVar(&c.Readiness, "readiness", c.Readiness, "what /readyz on --metrics-address reports ready: running (a standby, or a member whose etcd runs) or voter (a voting member whose etcd serves: what a Kubernetes Service and PodDisruptionBudget should count)")
	fs.DurationVar(&c.CertValidity, "cert-validity", c.CertValidity, "validity of the node certificates the agent issues itself; each is renewed two thirds into its life, with no restart")
	fs.StringVar(&c.EtcdBinDir, "etcd-bin-dir", c.EtcdBinDir, "directory holding etcd installs as etcd-v<version>/etcd (or etcd-v<version>-linux-amd64/etcd), with etcdctl and etcdutl beside it")
	fs.IntVar(&c.DiscoveryMaxRecords, "discovery-max-records", c.DiscoveryMaxRecords, "the most discovery records read (from the store, or a file:// directory) each cycle: records planted without end are cut off here, and the cut is logged")
	fs.StringVar(&c.Discovery, "discovery", c.Discovery, "how agents find each other: store (records in the backup store), file:///DIR (a shared directory), static:HOST:PORT,... (a seed list of peer API addresses) or dns:NAME (SRV, or A records with --peer-port)")
	fs.DurationVar(&c.MemberFailureGrace, "member-failure-grace", c.MemberFailureGrace, "how long a member may be unhealthy before a standby agent replaces it")
	fs.DurationVar(&c.LearnerTimeout, "learner-timeout", c.LearnerTimeout, "how long a new member may take to start and catch up as a learner before it is removed again (its node waits before it is added again); allow for copying the whole database")
	fs.DurationVar(&c.LeaderLease, "leader-lease", c.LeaderLease, "lease of the backup-store lock that elects a leader while etcd has no quorum; clocks must agree to well within it")
	backup(fs, &c.Backup)
	captureFlags(fs, &c.Capture)
	compaction(fs, &c.Compaction)
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress, "host:port to serve Prometheus metrics on at /metrics (off when empty)")
	fs.BoolVar(&c.EnablePprof, "enable-pprof", c.EnablePprof, "also serve Go's runtime profiles at /debug/pprof/ on --metrics-address, for performance work (they show the agent's internals: keep the address private)")
	fs.DurationVar(&c.LoopInterval, "loop-interval", c.LoopInterval, "time between control-loop cycles")
	fs.DurationVar(&c.EtcdStopTimeout, "etcd-stop-timeout", c.EtcdStopTimeout, "how long a graceful etcd stop may take before etcd is killed")
	fs.DurationVar(&c.Trash.MaxAge, "trash-max-age", c.Trash.MaxAge, "copies of etcd data moved to <data-dir>/trash are deleted after this long, once this node is a healthy member whose live data supersedes them; the newest copy is always kept (0 keeps them for ever)")
	fs.Int64Var(&c.MaxSnapshotBytes, "max-snapshot-bytes", c.MaxSnapshotBytes, "largest etcd snapshot the agent unpacks from a backup, for a restore or the check before one; a backup whose snapshot would be larger, or would leave less than 1 GiB (a tenth of a disk under 10 GiB) free on the data dir's disk, is refused and named")
	fs.Int64Var(&c.Trash.MaxBytes, "trash-max-bytes", c.Trash.MaxBytes, "older copies in <data-dir>/trash are also deleted, oldest first, while the trash holds more than this many bytes, under the same conditions (0: no bound on size)")
	fs.DurationVar(&c.EtcdCorruptCheckInterval, "etcd-corrupt-check-interval", c.EtcdCorruptCheckInterval, "how often etcd's periodic corruption check hashes every member's keyspace at one revision and compares them (0: never; a mismatch raises etcd's CORRUPT alarm); etcd's checks at start and after each compaction are always on")
	fs.DurationVar(&c.RestoreDrillInterval, "restore-drill-interval", c.RestoreDrillInterval, "how often the leader checks that the newest backup restores: it restores it into a scratch etcd on loopback under --data-dir's tmp/ (when the snapshot and its copy fit on that disk), compares its revision and HashKV with the backup's meta, and records the outcome in the store; the cluster is not touched (0: never)")
	fs.DurationVar(&c.HashCheckInterval, "hash-check-interval", c.HashCheckInterval, "how often the leader compares every voting member's HashKV at one revision; a member whose hash differs from a majority's has its data set aside and is rebuilt from its peers (0: never; etcd's CORRUPT alarm still triggers a comparison)")
	fs.IntVar(&c.EtcdSnapshotCount, "etcd-snapshot-count", c.EtcdSnapshotCount, "etcd's --snapshot-count: committed entries between raft snapshots (0 keeps etcd's default); an upgrade from 3.5 past 3.6 waits for a snapshot on every member")
}

// BackupAgent registers the backup agent's flags on fs, bound to c.
func BackupAgent(fs *pflag.FlagSet, c *backupagent.Config) {
	fs.StringVar(&c.BackupStore, controller.FlagBackupStore, c.BackupStore, "URL of the backup store: file:///path, s3://bucket/prefix, gs://bucket/prefix or azblob://container/prefix (required)")
	fs.StringSliceVar(&c.Endpoints, "endpoints", c.Endpoints, "etcd client URLs, comma-separated (required)")
	fs.StringVar(&c.CACert, "cacert", c.CACert, "CA bundle that signed etcd's server certificates (https endpoints)")
	fs.StringVar(&c.Cert, "cert", c.Cert, "client certificate for etcd, when it requires client-certificate auth")
	fs.StringVar(&c.Key, "key", c.Key, "private key of --cert")
	backup(fs, &c.Backup)
	fs.StringVar(&c.TempDir, "temp-dir", c.TempDir, "directory for a snapshot while it is verified and compressed; it needs room for one full database")
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress, "host:port to serve Prometheus metrics on at /metrics (off when empty)")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this agent's name in the store's lock (default: host name and a random suffix)")
	fs.DurationVar(&c.LockLease, "lock-lease", c.LockLease, "lease of the store lock that picks one backup agent when several share a store")
	fs.DurationVar(&c.LoopInterval, "loop-interval", c.LoopInterval, "time between cycles (queued commands are picked up once per cycle)")
	captureFlags(fs, &c.Capture)
}

// backup registers the full-backup flags, which both agents take.
func backup(fs *pflag.FlagSet, c *backupjob.Config) {
	fs.DurationVar(&c.Interval, "backup-interval", c.Interval, "time between periodic full backups to the backup store; the managing agent also backs up before every membership change")
	fs.StringVar(&c.Retention, "backup-retention", c.Retention, "which backups to keep: default (everything under 1h, hourly for 7d, daily for 90d), exponential (hourly for 24h, daily for 7d, weekly for 4w) or count:N; the newest, and any a queued restore names, are always kept")
	fs.DurationVar(&c.RetryDelay, "backup-retry-delay", c.RetryDelay, "wait after a failed backup before the next attempt; it doubles with each further failure, up to --backup-interval")
	fs.StringVar(&c.EncryptionKeyFile, backupjob.FlagEncryptionKeyFile, c.EncryptionKeyFile, "file holding an age key (as age-keygen writes it, mode 0600) to encrypt backups and captured segments with, and to read them; read at start (default: no encryption; see docs/security.md)")
	fs.StringSliceVar(&c.DecryptionKeyFiles, backupjob.FlagDecryptionKeyFiles, c.DecryptionKeyFiles, "file holding an older age key, only to read the backups and captured segments it encrypted, as during a key rotation; repeat the flag for several")
}

// compaction registers the compaction flags.
func compaction(fs *pflag.FlagSet, c *maintenance.CompactionConfig) {
	fs.DurationVar(&c.Interval, "compaction-interval", c.Interval, "how often the agent leading etcd checks the spec's compaction policy (configure-cluster --auto-compaction-mode/--auto-compaction-retention) and compacts")
	fs.DurationVar(&c.CaptureWait, "compaction-capture-wait", c.CaptureWait, "how long continuous capture may make no progress while it holds compaction back (compaction never goes past what capture made durable in the store) before compaction goes ahead anyway and a full backup is taken")
	fs.Float64Var(&c.QuotaShare, "compaction-quota-share", c.QuotaShare, "share of the backend quota (configure-cluster --quota-backend-bytes, else etcd's 2 GiB) the database's bytes in use may reach while a stalled capture holds compaction back; above it compaction goes ahead at once")
}

// capture registers the continuous-capture flags, which both agents take.
func captureFlags(fs *pflag.FlagSet, c *changelog.Config) {
	fs.BoolVar(&c.Enabled, "capture", c.Enabled, "continuous capture: the leader writes every change to the store's wal/ prefix, for restores to any point (see docs/disaster-recovery.md)")
	fs.DurationVar(&c.CutInterval, "capture-cut-interval", c.CutInterval, "how often captured changes are made durable and uploaded: the RPO of continuous capture is about this plus the upload's time")
	fs.Int64Var(&c.MaxSegmentBytes, "capture-max-segment-bytes", c.MaxSegmentBytes, "cut a segment early at this size")
	fs.Int64Var(&c.MaxSpoolBytes, "capture-max-spool-bytes", c.MaxSpoolBytes, "bound on captured changes kept on local disk while the store is unreachable; when full, capture stops and a full backup is taken once the store is back")
	fs.DurationVar(&c.LeasePollInterval, "capture-lease-poll-interval", c.LeasePollInterval, "how often leases are listed to capture grants and revocations")
	fs.DurationVar(&c.MergeInterval, "capture-merge-interval", c.MergeInterval, "how often the capturing agent merges the segments of closed windows into larger ones (0: never)")
	fs.DurationVar(&c.DigestInterval, "capture-digest-interval", c.DigestInterval, "how often capture reads every key at a captured revision from etcd and records their digest, which a restore reaching that revision must match (0: never; each costs a full read of the keyspace)")
	fs.DurationVar(&c.MaxClockOffset, "capture-max-clock-offset", c.MaxClockOffset, "capture only while this agent's clock is at most this far off its peers' (and a second more off the store's): the revisions' times, which --to-time goes by, come from the capturing agent's clock")
	fs.DurationSliceVar(&c.MergeWindows, "capture-merge-windows", c.MergeWindows, "the merge windows, one per level: segments cut in one window are merged into one segment of the next level")
}

// Operator registers the operator's flags on fs, bound to c.
func Operator(fs *pflag.FlagSet, c *operator.Config) {
	fs.StringVar(&c.Image, "image", c.Image, "image of the member pods of an EtcdCluster that sets no spec.image (default: the operator's own, read from its pod, named by $POD_NAMESPACE and $POD_NAME)")
	fs.StringSliceVar(&c.ImageVersions, "image-etcd-versions", c.ImageVersions, "the etcd versions the member image carries, comma separated; a cluster on that image whose versions it lacks is held, not rolled (default: the versions recorded in the operator's own image at "+operator.ImageVersionsFile+", when --image is not set)")
	fs.StringVar(&c.ClusterDomain, "cluster-domain", c.ClusterDomain, "the Kubernetes cluster's DNS domain: the members' certificates name <cluster>-client.<namespace>.svc.<domain> and each pod's <pod>.<cluster>.<namespace>.svc.<domain>")
	fs.StringSliceVar(&c.Namespaces, "namespaces", c.Namespaces, "watch only these namespaces, comma separated, with a Role in each (default: all, with a ClusterRole)")
	fs.StringSliceVar(&c.Namespaces, "namespace", c.Namespaces, "the same as --namespaces")
	_ = fs.MarkHidden("namespace")
	fs.BoolVar(&c.LeaderElection, "leader-elect", c.LeaderElection, "elect one active operator among replicas with a Lease")
	fs.StringVar(&c.LeaderElectionID, "leader-election-id", c.LeaderElectionID, "name of the leader election Lease; installs that share a namespace need one each")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", c.LeaderElectionNamespace, "namespace of the leader election Lease (default: the operator's own, from the service account)")
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress, "host:port for Prometheus metrics at /metrics (0 turns them off)")
	fs.StringVar(&c.HealthAddress, "health-address", c.HealthAddress, "host:port for /healthz and /readyz (0 turns them off)")
}

// Log registers --log-level and --log-format, which every command takes.
func Log(fs *pflag.FlagSet, c *cli.LogConfig) {
	fs.StringVar(&c.Level, "log-level", c.Level, "log level: debug, info, warn or error")
	fs.StringVar(&c.Format, "log-format", c.Format, "log format: text or json")
}

// Normalize rewrites single-dash long flags that fs knows, such as
// -member-count=1 or -backup-store X, into their double-dash form, so the
// spellings of the original etcd-manager walkthrough keep working with
// pflag. Shorthand flags (-h) and everything after "--" are left alone.
func Normalize(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, arg := range args {
		if arg == "--" {
			return append(out, args[i:]...)
		}
		if len(arg) > 2 && arg[0] == '-' && arg[1] != '-' {
			name, _, _ := strings.Cut(arg[1:], "=")
			if len(name) > 1 && fs.Lookup(name) != nil {
				arg = "-" + arg
			}
		}
		out = append(out, arg)
	}
	return out
}
