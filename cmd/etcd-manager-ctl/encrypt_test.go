package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
	"github.com/etcd-manager/etcd-manager/internal/peer"
)

// The ctl reads metas only, and needs no key: it shows which key a backup
// needs. A key file is taken only by --to-time, and checked as the
// agents check theirs.
func TestCtlAndEncryptedBackups(t *testing.T) {
	const name = "2026-11-22T05:00:00Z-000001"
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	e.plantBackup(t, name, []byte(`{"etcdVersion":"3.6.16","timestamp":"1795410000","clusterToken":"tok1","revision":5,`+
		`"encryption":{"scheme":"age","keyId":"age:0123456789abcdef"}}`), []byte("age-encryption.org/v1\n..."))
	out, _, err := e.run(t, "list-backups", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"encryptionKeyId": "age:0123456789abcdef"`) {
		t.Errorf("list-backups -o json = %s, want the key ID", out)
	}

	dir := t.TempDir()
	key, _ := crypttest.KeyFile(t, dir, "k")
	if _, _, err := e.run(t, "restore-backup", "--backup-decryption-key-file="+key, name); err == nil ||
		!strings.Contains(err.Error(), "--backup-decryption-key-file is only for --to-time") {
		t.Errorf("a key file with a named backup: %v", err)
	}
	shared := filepath.Join(dir, "shared")
	data, _ := os.ReadFile(key)
	if err := os.WriteFile(shared, data, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(shared, 0o644)
	_, _, err = e.run(t, "restore-backup", "--to-time=2026-11-22T05:00:00Z", "--backup-decryption-key-file="+shared)
	if err == nil || !strings.Contains(err.Error(), "has mode 0644") || strings.Contains(err.Error(), "AGE-SECRET-KEY") {
		t.Errorf("a shared key file: %v", err)
	}
	if list, _, _ := e.run(t, "list-commands", "-o", "json"); strings.TrimSpace(list) != "[]" {
		t.Errorf("a refused restore queued a command: %s", list)
	}
}

// status -o json shows the key IDs each agent holds, to follow a key
// rotation across the agents.
func TestStatusShowsBackupKeys(t *testing.T) {
	a := cli.AgentFromInfo("10.0.0.1:8000", peer.NodeInfo{NodeID: "a", BackupKeys: []string{"age:0123456789abcdef", "age:fedcba9876543210"}})
	if len(a.BackupKeys) != 2 || a.BackupKeys[0] != "age:0123456789abcdef" {
		t.Fatalf("BackupKeys = %v", a.BackupKeys)
	}
}
