package spec

import (
	"errors"
	"strings"
	"testing"
)

func TestNewerFormats(t *testing.T) {
	tests := []struct {
		name   string
		decode func() error
		newer  bool
	}{
		{"kops command, no format", func() error { _, err := DecodeCommand([]byte(`{"timestamp":"1","backupNow":{}}`)); return err }, false},
		{"command of this format", func() error { _, err := DecodeCommand([]byte(`{"format":1,"backupNow":{}}`)); return err }, false},
		{"point-in-time restore", func() error {
			_, err := DecodeCommand([]byte(`{"format":2,"restoreBackup":{"backup":"b","toRevision":9,"timeline":"t"}}`))
			return err
		}, false},
		{"restore that requires a digest", func() error {
			_, err := DecodeCommand([]byte(`{"format":3,"restoreBackup":{"backup":"b","toRevision":9,"timeline":"t","requireDigest":true}}`))
			return err
		}, false},
		{"command of a newer format", func() error { _, err := DecodeCommand([]byte(`{"format":4,"backupNow":{}}`)); return err }, true},
		{"newer command of an unknown kind is newer, not junk", func() error { _, err := DecodeCommand([]byte(`{"format":4,"rollCA":{}}`)); return err }, true},
		{"status of this format", func() error { _, err := DecodeCommandStatus([]byte(`{"format":1,"state":"running"}`)); return err }, false},
		{"status without format", func() error { _, err := DecodeCommandStatus([]byte(`{"state":"running"}`)); return err }, false},
		{"status of a newer format", func() error { _, err := DecodeCommandStatus([]byte(`{"format":7,"state":"running"}`)); return err }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.decode()
			if got := errors.Is(err, ErrNewerFormat); got != tt.newer {
				t.Fatalf("error %v: newer = %v, want %v", err, got, tt.newer)
			}
			if tt.newer && !strings.Contains(err.Error(), "understands formats up to 3") {
				t.Errorf("error %q does not say which formats this version understands", err)
			}
		})
	}
}

// A command is written in the oldest format that holds its meaning: an
// agent too old for it refuses it rather than act on less than was asked.
func TestNeededFormat(t *testing.T) {
	point := RestorePoint{ToRevision: 9, Timeline: "t"}
	tests := []struct {
		name string
		cmd  Command
		want int
	}{
		{"backup-now", Command{BackupNow: &BackupNowCommand{}}, FormatBase},
		{"restore of a backup", Command{RestoreBackup: &RestoreBackupCommand{Backup: "b"}}, FormatBase},
		{"restore of a point", Command{RestoreBackup: &RestoreBackupCommand{Backup: "b", RestorePoint: point}}, FormatPointInTime},
		{"restore of a point that requires a digest", Command{RestoreBackup: &RestoreBackupCommand{Backup: "b", RestorePoint: point, RequireDigest: true}}, FormatRequireDigest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cmd.NeededFormat(); got != tt.want {
				t.Errorf("NeededFormat() = %d, want %d", got, tt.want)
			}
		})
	}
}

// A status's transfer and a command's expiry are read back; a negative
// transfer figure is junk.
func TestStatusTransferAndExpiry(t *testing.T) {
	st, err := DecodeCommandStatus([]byte(`{"state":"running","transfer":{"done":5,"total":10,"started":"7"}}`))
	if err != nil || st.Transfer == nil || st.Transfer.Done != 5 || st.Transfer.Total != 10 || st.Transfer.Started != 7 {
		t.Errorf("transfer read back as %+v, %v", st.Transfer, err)
	}
	if _, err := DecodeCommandStatus([]byte(`{"state":"running","transfer":{"done":-5}}`)); err == nil {
		t.Error("a negative transfer was read")
	}
	c, err := DecodeCommand([]byte(`{"timestamp":"1","expires":"3600000000001","restoreBackup":{"backup":"b"}}`))
	if err != nil || c.Expires != 3600000000001 {
		t.Errorf("expires read back as %d, %v", c.Expires, err)
	}
}
