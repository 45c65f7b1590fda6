package crypttest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
)

// KeyFileContents returns a new X25519 key as age-keygen writes it, and
// its key ID.
func KeyFileContents(t testing.TB) ([]byte, string) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	data := fmt.Sprintf("# created: %s\n# public key: %s\n%s\n", time.Now().UTC().Format(time.RFC3339), id.Recipient(), id)
	return []byte(data), crypt.KeyID(id.Recipient().String())
}

// KeyFile writes a new key as dir/name, mode 0600, and returns its path
// and key ID.
func KeyFile(t testing.TB, dir, name string) (string, string) {
	t.Helper()
	data, kid := KeyFileContents(t)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, kid
}

// Key returns a new key.
func Key(t testing.TB) *crypt.Key {
	t.Helper()
	data, _ := KeyFileContents(t)
	k, err := crypt.ParseKey(data, "test key")
	if err != nil {
		t.Fatal(err)
	}
	return k
}
