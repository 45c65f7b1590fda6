package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Command is a queued command, control/<id>/_command.json. The timestamp
// and restoreBackup fields are the etcd-manager format's; backupNow is
// ours. Exactly one kind is set.
type Command struct {
	// Format is the record's format (see FormatVersion); kops's commands
	// carry none.
	Format int `json:"format,omitempty"`
	// Timestamp is when the command was queued, in unix nanoseconds.
	Timestamp Int64 `json:"timestamp"`
	// Expires, when set, is when a command that has not started yet is
	// failed instead of started, in unix nanoseconds: a restore queued
	// for a cluster that was down must not replace the cluster hours
	// after it came back. A command that has started never expires.
	// Agents from before it ignore it, and start the command whenever
	// they can, as they always did.
	Expires       Int64                 `json:"expires,omitempty"`
	RestoreBackup *RestoreBackupCommand `json:"restoreBackup,omitempty"`
	BackupNow     *BackupNowCommand     `json:"backupNow,omitempty"`
	RecoverQuorum *RecoverQuorumCommand `json:"recoverQuorum,omitempty"`
	DumpRestore   *DumpRestoreCommand   `json:"dumpRestore,omitempty"`
	Defrag        *DefragCommand        `json:"defrag,omitempty"`
}

// DefragCommand asks the leader to defragment every member now, one at
// a time, whatever the defrag policy and its window say.
type DefragCommand struct{}

// DumpRestoreCommand changes the etcd version by dump and restore. The
// leader queues it itself, when the spec asks for a version no rolling
// change reaches and allows dump and restore: the cluster is quarantined,
// backed up, and replaced by a new cluster of EtcdVersion made from that
// backup.
type DumpRestoreCommand struct {
	EtcdVersion string `json:"etcdVersion"`
}

// RecoverQuorumCommand asks the leader to rebuild a cluster that lost
// quorum from its surviving member's data.
type RecoverQuorumCommand struct {
	// Lost names the members (their node IDs) the operator knows to be
	// gone for good. A survivor forces a new cluster only with evidence
	// that the other members have no quorum; a member named lost whose
	// agent has been silent for a lease counts as such.
	Lost []string `json:"lost,omitempty"`
}

// RestoreBackupCommand asks the leader to restore the named backup, or,
// with a RestorePoint's ToRevision, the state at that revision.
type RestoreBackupCommand struct {
	ClusterSpec *ClusterSpec `json:"clusterSpec,omitempty"`
	Backup      string       `json:"backup"`
	RestorePoint
	// RequireDigest refuses a point that no digest recorded by capture
	// checks: one with captured changes applied and no digest between the
	// backup's revision and the target.
	RequireDigest bool `json:"requireDigest,omitempty"`
}

// RestorePoint says how far past its full backup a restore goes, and
// how: the backup is brought forward to ToRevision with the captured
// segments of Timeline (a cluster token).
type RestorePoint struct {
	ToRevision int64  `json:"toRevision,omitempty"`
	Timeline   string `json:"timeline,omitempty"`
	// BumpRevision and MarkCompacted are etcd's restore options: the
	// restored revision is raised by BumpRevision, and marked compacted,
	// so that clients that watch (Kubernetes) never see a revision twice.
	BumpRevision  int64 `json:"bumpRevision,omitempty"`
	MarkCompacted bool  `json:"markCompacted,omitempty"`
}

// Validate checks a point read from a command or a peer.
func (p RestorePoint) Validate() error {
	if p.ToRevision < 0 || p.BumpRevision < 0 {
		return errors.New("spec: restore point: toRevision and bumpRevision cannot be negative")
	}
	if p.ToRevision > 0 && !ValidClusterToken(p.Timeline) {
		return fmt.Errorf("spec: restore point: toRevision needs the timeline (a cluster token) whose segments lead there, not %q", p.Timeline)
	}
	if (p.BumpRevision > 0) != p.MarkCompacted {
		return errors.New("spec: restore point: bumpRevision and markCompacted go together, as in etcd's own restore")
	}
	return nil
}

// IsZero reports whether the point is the full backup alone, restored
// as it is.
func (p RestorePoint) IsZero() bool { return p == RestorePoint{} }

// NeededFormat is the oldest record format that holds the command's
// meaning.
func (c Command) NeededFormat() int {
	if r := c.RestoreBackup; r != nil && r.RequireDigest {
		return FormatRequireDigest
	}
	if r := c.RestoreBackup; r != nil && !r.RestorePoint.IsZero() {
		return FormatPointInTime
	}
	return FormatBase
}

// BackupNowCommand asks the leader for a full backup at once.
type BackupNowCommand struct{}

// Kind names the command's kind, as list-commands shows it.
func (c Command) Kind() string {
	switch {
	case c.RestoreBackup != nil:
		return "restore-backup"
	case c.BackupNow != nil:
		return "backup-now"
	case c.RecoverQuorum != nil:
		return "recover-quorum"
	case c.DumpRestore != nil:
		return "dump-restore"
	case c.Defrag != nil:
		return "defrag"
	default:
		return "unknown"
	}
}

// Validate checks that exactly one kind is set, with what it needs.
func (c Command) Validate() error {
	n := 0
	if c.RestoreBackup != nil {
		n++
		if c.RestoreBackup.Backup == "" {
			return errors.New("spec: restoreBackup names no backup")
		}
		if err := c.RestoreBackup.RestorePoint.Validate(); err != nil {
			return err
		}
	}
	if c.BackupNow != nil {
		n++
	}
	if c.RecoverQuorum != nil {
		n++
	}
	if c.Defrag != nil {
		n++
	}
	if c.DumpRestore != nil {
		n++
		if _, err := ParseSupportedVersion(c.DumpRestore.EtcdVersion); err != nil {
			return fmt.Errorf("spec: dumpRestore: %w", err)
		}
	}
	switch n {
	case 0:
		return errors.New("spec: command has no known kind (want restoreBackup, backupNow, recoverQuorum, dumpRestore or defrag)")
	case 1:
		return nil
	default:
		return errors.New("spec: command sets more than one kind")
	}
}

// DecodeCommand parses and validates a _command.json. A command of a
// newer format than this etcd-manager understands is an error wrapping
// ErrNewerFormat: it may be valid, just not to this version.
func DecodeCommand(data []byte) (Command, error) {
	var c Command
	if len(bytes.TrimSpace(data)) == 0 {
		return c, errors.New("spec: command is empty")
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("spec: command is not valid JSON: %w", err)
	}
	if err := CheckFormat("the command", c.Format); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Command states, as the leader records them in _status.json.
const (
	CommandPending = "pending" // queued, not yet taken up (no status object)
	CommandRunning = "running"
	CommandDone    = "done"
	CommandFailed  = "failed"
)

// CommandStatus is control/<id>/_status.json, our addition: the leader's
// progress on a command. The command object itself is only ever written
// by whoever queued it.
type CommandStatus struct {
	// Format is the record's format (see FormatVersion).
	Format int `json:"format,omitempty"`
	// Term is the fencing term of the driver that wrote it, 0 for a status
	// written outside a procedure. Readers take the status of the highest
	// term, so a stale driver's late write changes nothing.
	Term  int64  `json:"term,omitempty"`
	State string `json:"state"`
	// Message says why a command failed, or what it is doing.
	Message string `json:"message,omitempty"`
	// Backup is the backup a backup-now command took.
	Backup string `json:"backup,omitempty"`
	// Defragmented are the members (node IDs) a defrag command has
	// defragmented so far.
	Defragmented []string `json:"defragmented,omitempty"`
	// Restore is a restore's progress, fixed once it starts stopping the
	// old cluster, so that a new leader resumes it exactly.
	Restore *RestoreProgress `json:"restore,omitempty"`
	// Node is the member a recover-quorum rebuilds the cluster from, and
	// NodeToken the cluster it was chosen from.
	Node      string `json:"node,omitempty"`
	NodeToken string `json:"nodeToken,omitempty"`
	// Transfer is how far the running command's long transfer has gone
	// (a backup-now's snapshot stream), while it runs.
	Transfer *Transfer `json:"transfer,omitempty"`
	// Updated is when the status was written, in unix nanoseconds.
	Updated Int64 `json:"updated"`
}

// Transfer is how far a long transfer has gone: Done bytes of Total
// (0: not known ahead), since Started (unix nanoseconds). What names it
// where a node reports its own ("fetch <backup>").
type Transfer struct {
	What    string `json:"what,omitempty"`
	Done    int64  `json:"done"`
	Total   int64  `json:"total,omitempty"`
	Started Int64  `json:"started"`
}

// Finished reports whether the command is done or failed.
func (s CommandStatus) Finished() bool {
	return s.State == CommandDone || s.State == CommandFailed
}

// DecodeCommandStatus parses a _status.json. A status of a newer format
// than this etcd-manager understands is an error wrapping ErrNewerFormat.
func DecodeCommandStatus(data []byte) (CommandStatus, error) {
	var s CommandStatus
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("spec: command status is not valid JSON: %w", err)
	}
	if err := CheckFormat("the command's status", s.Format); err != nil {
		return s, err
	}
	if err := checkTokens(map[string]string{"the status's node token": s.NodeToken}); err != nil {
		return s, err
	}
	if t := s.Transfer; t != nil && (t.Done < 0 || t.Total < 0 || t.Started < 0) {
		return s, errors.New("spec: the status's transfer has a negative figure")
	}
	return s, s.Restore.checkTokens("the status's restore")
}

// checkTokens checks the tokens that are set, by what they are.
func checkTokens(tokens map[string]string) error {
	for what, t := range tokens {
		if t == "" {
			continue
		}
		if err := CheckClusterToken(what, t); err != nil {
			return err
		}
	}
	return nil
}

// checkTokens checks the tokens the restore has set: they name folders
// on the nodes.
func (r *RestoreProgress) checkTokens(what string) error {
	if r == nil {
		return nil
	}
	return checkTokens(map[string]string{
		what + "'s token":        r.Token,
		what + "'s old token":    r.OldToken,
		what + "'s parent token": r.ParentToken,
	})
}

// Restore phases, in order. A dump-restore starts with the first two.
const (
	RestoreQuarantining = "quarantining" // dump-restore: the old members stop serving clients
	RestoreDumping      = "dumping"      // dump-restore: a backup of the quarantined cluster
	RestoreStopping     = "stopping"     // the old members stop and move their data to the trash
	RestoreRestoring    = "restoring"    // the chosen nodes restore the backup and start, quarantined
	RestoreVerifying    = "verifying"    // HashKV must agree across the new members
	RestoreLifting      = "lifting"      // the quarantine is lifted: clients are back
	RestoreBackingUp    = "backing-up"   // a fresh backup of the restored cluster, while clients write
)

// RestoreProgress is where a restore stands.
type RestoreProgress struct {
	Phase string `json:"phase"`
	// Token is the new cluster's token.
	Token string `json:"token"`
	// Members are the node IDs chosen as the new cluster's members, and
	// InitialCluster their etcd --initial-cluster.
	Members        []string `json:"members"`
	InitialCluster string   `json:"initialCluster"`
	EtcdVersion    string   `json:"etcdVersion"`
	// OldToken is the token of the cluster a dump-restore replaces, and
	// Backup the backup it took of it.
	OldToken string `json:"oldToken,omitempty"`
	Backup   string `json:"backup,omitempty"`
	// ParentToken and ParentRevision are the timeline and revision the
	// new cluster starts from: recorded as its branch once it is backed
	// up, so restores can follow its history back.
	ParentToken    string `json:"parentToken,omitempty"`
	ParentRevision int64  `json:"parentRevision,omitempty"`
	// Lifted is when the lift of the quarantine was recorded, in unix
	// nanoseconds: no client wrote to the restored cluster before. Its
	// timeline's branch record begins then.
	Lifted Int64 `json:"lifted,omitempty"`
	// Fresh is the fresh backup of the restored cluster, once it is
	// taken: the restore is then complete.
	Fresh string `json:"fresh,omitempty"`
	// Check says whether what is restored was checked against etcd
	// itself (RestoreVerified) or not (RestoreUnverified), and
	// DigestRevision the revision of the digest it was checked against (0
	// when the backup alone is restored).
	Check          string `json:"check,omitempty"`
	DigestRevision int64  `json:"digestRevision,omitempty"`
}

// A restore's check. A backup restored as it is holds the snapshot etcd
// wrote, its checksums verified: verified. A backup brought forward with
// captured changes is verified when a digest capture read from etcd lies
// between the backup's revision and the target, and the restored data
// matches it; unverified when none does.
const (
	RestoreVerified   = "verified"
	RestoreUnverified = "unverified"
)

// Choice is what a procedure decides once, before anything acts on it:
// a restore's new cluster (token, members, version) or a recover-quorum's
// survivor. It is written create-once (control/<id>/_choice.json), so
// that every driver of the procedure, the first or a later one, acts on
// the same choice.
type Choice struct {
	// Format is the record's format (see FormatVersion).
	Format int `json:"format,omitempty"`
	// Term is the fencing term of the driver that chose.
	Term int64 `json:"term"`
	// Restore is the new cluster of a restore or dump-restore; its Phase
	// and Backup are not part of the choice.
	Restore *RestoreProgress `json:"restore,omitempty"`
	// Survivor is the node a recover-quorum rebuilds the cluster from,
	// and SurvivorToken the cluster it was chosen from.
	Survivor      string `json:"survivor,omitempty"`
	SurvivorToken string `json:"survivorToken,omitempty"`
}

// DecodeChoice parses a _choice.json. A choice of a newer format is an
// error wrapping ErrNewerFormat.
func DecodeChoice(data []byte) (Choice, error) {
	var c Choice
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("spec: procedure choice is not valid JSON: %w", err)
	}
	if err := CheckFormat("the procedure's choice", c.Format); err != nil {
		return c, err
	}
	if c.Restore == nil && c.Survivor == "" {
		return c, errors.New("spec: procedure choice holds nothing")
	}
	if c.Restore != nil {
		if err := CheckClusterToken("the choice's restore token", c.Restore.Token); err != nil {
			return c, err
		}
	}
	if err := checkTokens(map[string]string{"the choice's survivor token": c.SurvivorToken}); err != nil {
		return c, err
	}
	return c, c.Restore.checkTokens("the choice's restore")
}

// Apply overlays the choice onto a status read beside it: what was
// chosen once is what every driver acts on.
func (c Choice) Apply(st *CommandStatus) {
	if r := c.Restore; r != nil && st.Restore != nil {
		p := *st.Restore
		p.Token, p.Members, p.InitialCluster, p.EtcdVersion, p.OldToken = r.Token, r.Members, r.InitialCluster, r.EtcdVersion, r.OldToken
		st.Restore = &p
	}
	if c.Survivor != "" {
		st.Node, st.NodeToken = c.Survivor, c.SurvivorToken
	}
}
