package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// A command whose expiry passed before the leader started it is failed,
// saying so, and nothing else plans it; one that has started goes on
// whatever its expiry says.
func TestPlanExpiredCommands(t *testing.T) {
	queued := time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)
	expired := func(c Command) Command {
		c.Expired = true
		c.Command.Timestamp = spec.Int64(queued.UnixNano())
		c.Command.Expires = spec.Int64(queued.Add(time.Hour).UnixNano())
		return c
	}
	restore := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b1"}}, "")
	restoring := restore
	restoring.Status = spec.CommandStatus{State: spec.CommandRunning, Restore: &spec.RestoreProgress{Phase: spec.RestoreQuarantining, Token: "new", Members: []string{"a"}, EtcdVersion: "3.6.16"}}
	recoverCmd := cmd("q1", spec.Command{RecoverQuorum: &spec.RecoverQuorumCommand{}}, "")
	waitingRecover := recoverCmd
	waitingRecover.Status = spec.CommandStatus{State: spec.CommandPending, Message: "waiting for evidence"}
	backupNow := cmd("n1", spec.Command{BackupNow: &spec.BackupNowCommand{}}, "")
	retryingBackup := backupNow
	retryingBackup.Status = spec.CommandStatus{State: spec.CommandRunning, Message: "taking a backup"}
	defrag := cmd("d1", spec.Command{Defrag: &spec.DefragCommand{}}, "")

	leader := func(cmds ...Command) Observed {
		o := leaderObs(1, cluster(member("a", true)), node("a", "member"))
		o.LockHeld, o.BackedUpSinceChange = true, true
		o.Commands = cmds
		return o
	}
	tests := []struct {
		name        string
		obs         Observed
		wantFail    string // the command failed as expired
		notPlanned  string // an action that must not be planned
		wantPlanned string
	}{
		{name: "restore not started", obs: leader(expired(restore)), wantFail: "r1", notPlanned: "prepare-restore"},
		{name: "restore started: goes on", obs: leader(expired(restoring)), wantPlanned: "r1"},
		{name: "restore not expired: starts", obs: leader(restore), wantPlanned: "prepare-restore r1"},
		{name: "recover-quorum waiting for evidence", obs: leader(expired(waitingRecover)), wantFail: "q1"},
		{name: "backup-now not started", obs: leader(expired(backupNow)), wantFail: "n1", notPlanned: "take-backup"},
		{name: "backup-now retrying: goes on", obs: leader(expired(retryingBackup)), wantPlanned: "n1"},
		{name: "defrag not started", obs: leader(expired(defrag)), wantFail: "d1", notPlanned: "defrag"},
		{name: "defrag not expired: starts", obs: leader(defrag), wantPlanned: "defrag"},
		{name: "an expired restore leaves the next one to run", obs: leader(expired(restore), cmd("r2", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b2"}}, "")),
			wantPlanned: "prepare-restore r2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			actions := Plan(tt.obs)
			got := describe(actions)
			var failed []string
			for _, a := range actions {
				if f, ok := a.(FailCommand); ok {
					if !strings.Contains(f.Reason, "expired before it started") || !strings.Contains(f.Reason, "queued 2026-12-04T01:00:00Z") {
						t.Errorf("fail-command %s says %q", f.ID, f.Reason)
					}
					failed = append(failed, f.ID)
				}
			}
			if tt.wantFail != "" && (len(failed) != 1 || failed[0] != tt.wantFail) {
				t.Errorf("failed %v, want %s expired; plan %s", failed, tt.wantFail, got)
			}
			if tt.wantFail == "" && len(failed) > 0 {
				t.Errorf("failed %v; plan %s", failed, got)
			}
			if tt.notPlanned != "" && strings.Contains(got, tt.notPlanned) {
				t.Errorf("plan %s has %q", got, tt.notPlanned)
			}
			if tt.wantPlanned != "" && !strings.Contains(got, tt.wantPlanned) {
				t.Errorf("plan %s lacks %q", got, tt.wantPlanned)
			}
			if ActiveExclusive(tt.obs.Commands) != nil && tt.wantFail != "" && tt.wantPlanned == "" {
				t.Errorf("ActiveExclusive still picks the expired command")
			}
		})
	}
}
