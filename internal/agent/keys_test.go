package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/backupagent"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
)

// The key files are checked when the configuration is validated, with
// every problem named at once, and the key never in a message.
func TestConfigValidateKeyFiles(t *testing.T) {
	dir := t.TempDir()
	good, _ := crypttest.KeyFile(t, dir, "good.key")
	secret, _ := os.ReadFile(good)
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shared := write("shared.key", secret, 0o644)
	groupRead := write("group.key", secret, 0o640)
	huge := write("huge.key", bytes.Repeat([]byte("#\n"), 40<<10), 0o600)
	junk := write("junk.key", []byte("not a key\n"), 0o600)
	tests := []struct {
		name    string
		enc     string
		dec     []string
		wantErr []string
	}{
		{name: "good encryption key", enc: good},
		{name: "good keys both ways", enc: good, dec: []string{good}},
		{name: "missing file", enc: filepath.Join(dir, "nope"), wantErr: []string{"--backup-encryption-key-file", "no such file"}},
		{name: "world readable", enc: shared, wantErr: []string{"--backup-encryption-key-file", "shared.key has mode 0644", "group or others may access it", "chmod 600"}},
		{name: "group readable", dec: []string{groupRead}, wantErr: []string{"--backup-decryption-key-file", "group.key has mode 0640"}},
		{name: "too large", enc: huge, wantErr: []string{"huge.key is 81920 bytes, over the 65536"}},
		{name: "not a key", dec: []string{good, junk}, wantErr: []string{"--backup-decryption-key-file", "junk.key holds no usable age key", "age-keygen"}},
		{name: "every problem at once", enc: shared, dec: []string{junk}, wantErr: []string{"shared.key has mode", "junk.key holds no usable"}},
		{name: "a directory", enc: dir, wantErr: []string{"is not a regular file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, kind := range []string{"agent", "backup-agent"} {
				var err error
				if kind == "agent" {
					c := validConfig()
					c.Backup.EncryptionKeyFile, c.Backup.DecryptionKeyFiles = tt.enc, tt.dec
					err = c.Validate()
				} else {
					c := backupagent.Default()
					c.BackupStore, c.Endpoints = "file:///tmp/x", []string{"http://127.0.0.1:2379"}
					c.Backup.EncryptionKeyFile, c.Backup.DecryptionKeyFiles = tt.enc, tt.dec
					c.Complete()
					err = c.Validate()
				}
				if len(tt.wantErr) == 0 {
					if err != nil {
						t.Fatalf("%s: %v", kind, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("%s: Validate accepted it", kind)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %q lacks %q", kind, err, w)
					}
				}
				if strings.Contains(err.Error(), "AGE-SECRET-KEY") {
					t.Errorf("%s: the error quotes the key: %v", kind, err)
				}
			}
		})
	}
}
