package backupjob

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
)

// No key file: no keyring, plaintext as before. Only decryption keys:
// old backups read, new ones written in plaintext.
func TestKeyringOfTheBackupConfig(t *testing.T) {
	if keys, err := Default().Keyring(); keys != nil || err != nil {
		t.Errorf("without key files: %v, %v", keys.IDs(), err)
	}
	old1, old1ID := crypttest.KeyFile(t, t.TempDir(), "old1.key")
	c := Default()
	c.DecryptionKeyFiles = []string{old1}
	keys, err := c.Keyring()
	if err != nil || keys.Encrypting() || !keys.Has(old1ID) {
		t.Errorf("with a decryption key only: encrypting %v, keys %v, %v", keys.Encrypting(), keys.IDs(), err)
	}
}

// The agent says at start whether it encrypts, with key IDs only.
func TestLogKeys(t *testing.T) {
	dir := t.TempDir()
	cur, curID := crypttest.KeyFile(t, dir, "current.key")
	secret, _ := os.ReadFile(cur)
	c := Default()
	c.EncryptionKeyFile = cur
	keys, err := c.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	LogKeys(slog.New(slog.NewTextHandler(&buf, nil)), keys)
	out := buf.String()
	if !strings.Contains(out, "encrypted at rest") || !strings.Contains(out, curID) {
		t.Errorf("log = %q, want the key ID", out)
	}
	for _, l := range strings.Split(string(secret), "\n") {
		if strings.HasPrefix(l, "AGE-SECRET-KEY") && strings.Contains(out, l) {
			t.Fatal("the key was logged")
		}
	}
}
