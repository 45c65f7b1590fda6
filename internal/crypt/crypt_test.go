package crypt_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
)

func encrypt(t *testing.T, r *crypt.Keyring, plain []byte) ([]byte, *crypt.Info) {
	t.Helper()
	var buf bytes.Buffer
	w, info, err := r.Encrypt(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), info
}

func TestRoundTrip(t *testing.T) {
	k := crypttest.Key(t)
	r := crypt.NewKeyring(k)
	plain := make([]byte, 300<<10) // several 64 KiB chunks
	rand.Read(plain)
	obj, info := encrypt(t, r, plain)
	if info == nil || info.Scheme != "age" || info.KeyID != k.ID() {
		t.Fatalf("info = %+v, want scheme age and key %s", info, k.ID())
	}
	if bytes.Contains(obj, plain[:64]) {
		t.Fatal("the object holds the plaintext")
	}
	dec, err := r.Decrypt(bytes.NewReader(obj), info, "obj")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(dec)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, plain) {
		t.Fatal("the plaintext differs after a round trip")
	}
	// EncryptReader makes an object Decrypt reads as well.
	er, info2, err := r.EncryptReader(bytes.NewReader(plain))
	if err != nil {
		t.Fatal(err)
	}
	obj2, _ := io.ReadAll(er)
	dec, err = r.Decrypt(bytes.NewReader(obj2), info2, "obj2")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(dec); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("EncryptReader round trip: %v", err)
	}
}

func TestKeyringWithoutWriteKeyPassesThrough(t *testing.T) {
	for _, r := range []*crypt.Keyring{nil, crypt.NewKeyring(nil, crypttest.Key(t))} {
		obj, info := encrypt(t, r, []byte("plain"))
		if info != nil || string(obj) != "plain" {
			t.Errorf("a keyring without a writing key wrote %q with info %+v", obj, info)
		}
		dec, err := r.Decrypt(strings.NewReader("plain"), nil, "obj")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := io.ReadAll(dec); string(got) != "plain" {
			t.Errorf("a plaintext object read %q", got)
		}
	}
}

func TestWrongOrMissingKey(t *testing.T) {
	a, b := crypttest.Key(t), crypttest.Key(t)
	obj, info := encrypt(t, crypt.NewKeyring(a), []byte("secret"))
	for _, tt := range []struct {
		name string
		r    *crypt.Keyring
		want string
	}{
		{"another key", crypt.NewKeyring(b), "the keys here are [" + b.ID() + "]"},
		{"no key", nil, "no key is configured here"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := &countingReader{r: bytes.NewReader(obj)}
			_, err := tt.r.Decrypt(src, info, "backup x")
			var nk *crypt.NoKeyError
			if !errors.Is(err, crypt.ErrNoKey) || !errors.As(err, &nk) {
				t.Fatalf("err = %v, want a NoKeyError", err)
			}
			for _, w := range []string{"backup x is encrypted with key " + a.ID(), tt.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if src.n != 0 {
				t.Errorf("%d bytes were read before the key was found missing", src.n)
			}
		})
	}
	// The record names a key held, but the object was encrypted to
	// another: corrupt, not a missing key.
	_, err := crypt.NewKeyring(b).Decrypt(bytes.NewReader(obj), &crypt.Info{Scheme: "age", KeyID: b.ID()}, "backup x")
	if !errors.Is(err, crypt.ErrCorrupt) || !strings.Contains(err.Error(), "is not encrypted to key "+b.ID()) {
		t.Fatalf("err = %v, want ErrCorrupt naming the key", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestTampering(t *testing.T) {
	k := crypttest.Key(t)
	r := crypt.NewKeyring(k)
	plain := make([]byte, 200<<10)
	rand.Read(plain)
	obj, info := encrypt(t, r, plain)
	flip := func(at int) []byte {
		b := bytes.Clone(obj)
		b[at] ^= 1
		return b
	}
	for _, tt := range []struct {
		name string
		obj  []byte
	}{
		{"payload byte flipped", flip(len(obj) / 2)},
		{"last byte flipped", flip(len(obj) - 1)},
		{"header byte flipped", flip(40)},
		{"cut at a chunk boundary", obj[:len(obj)-(len(obj)-200)%(64<<10+16)]},
		{"cut short", obj[:len(obj)-100]},
		{"trailing data", append(bytes.Clone(obj), 'x')},
		{"empty", nil},
		{"not age at all", []byte("\x1f\x8b gzip, say")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dec, err := r.Decrypt(bytes.NewReader(tt.obj), info, "segment s")
			if err == nil {
				_, err = io.Copy(io.Discard, dec)
			}
			if !errors.Is(err, crypt.ErrCorrupt) || !strings.Contains(err.Error(), "segment s") {
				t.Fatalf("err = %v, want ErrCorrupt naming the object", err)
			}
		})
	}
	// The store's own error is not the object's fault.
	storeErr := errors.New("connection reset")
	dec, err := r.Decrypt(io.MultiReader(bytes.NewReader(obj[:len(obj)/2]), errReader{storeErr}), info, "x")
	if err == nil {
		_, err = io.Copy(io.Discard, dec)
	}
	if !errors.Is(err, storeErr) || errors.Is(err, crypt.ErrCorrupt) {
		t.Fatalf("err = %v, want the store's error as it is", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestInfoFromTheStoreIsChecked(t *testing.T) {
	r := crypt.NewKeyring(crypttest.Key(t))
	for _, info := range []crypt.Info{{Scheme: "rot13", KeyID: "age:0123456789abcdef"}, {Scheme: "age", KeyID: "age:../../x"}, {Scheme: "age"}} {
		if err := r.Check("x", &info); !errors.Is(err, crypt.ErrCorrupt) {
			t.Errorf("Check(%+v) = %v, want ErrCorrupt", info, err)
		}
	}
}

func TestLoadKeyFile(t *testing.T) {
	dir := t.TempDir()
	path, id := crypttest.KeyFile(t, dir, "key.txt")
	k, err := crypt.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if k.ID() != id || !strings.HasPrefix(id, "age:") || len(id) != len("age:")+16 {
		t.Fatalf("ID = %s, want %s", k.ID(), id)
	}
	// The ID is stable: the same key read again has it.
	if k2, _ := crypt.LoadKeyFile(path); k2.ID() != k.ID() {
		t.Fatal("the key ID changed between two reads")
	}
	secret, _ := os.ReadFile(path)
	secretLine := ""
	for _, l := range strings.Split(string(secret), "\n") {
		if strings.HasPrefix(l, "AGE-SECRET-KEY-") {
			secretLine = l
		}
	}
	// Nothing prints the secret.
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("key", "key", k)
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s", k, k, k, k), logged.String()} {
		if strings.Contains(s, secretLine) || strings.Contains(s, "AGE-SECRET") || !strings.Contains(s, id) {
			t.Errorf("printed %q", s)
		}
	}

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
	pub, _ := age.GenerateX25519Identity()
	two := append(bytes.Clone(secret), secret...)
	for _, tt := range []struct {
		name, path string
		want       []string
	}{
		{"group readable", write("g", secret, 0o640), []string{"has mode 0640", "group or others", "chmod 600"}},
		{"world readable", write("w", secret, 0o604), []string{"has mode 0604"}},
		{"missing", filepath.Join(dir, "none"), []string{"no such file"}},
		{"a directory", dir, []string{"is not a regular file"}},
		{"too large", write("big", bytes.Repeat([]byte("# padding\n"), 7000), 0o600), []string{"is 70000 bytes, over the 65536"}},
		{"empty", write("empty", nil, 0o600), []string{"holds no usable age key"}},
		{"a public key", write("pub", []byte(pub.Recipient().String()+"\n"), 0o600), []string{"looks like a public key"}},
		{"two keys", write("two", two, 0o600), []string{"holds 2 keys"}},
		{"junk", write("junk", []byte("AGE-SECRET-KEY-1NOTAKEY\n"), 0o600), []string{"holds no usable age key", "line 1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := crypt.LoadKeyFile(tt.path)
			if !errors.Is(err, crypt.ErrKeyFile) {
				t.Fatalf("err = %v, want ErrKeyFile", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "AGE-SECRET-KEY-1") && tt.name != "junk" {
				t.Errorf("the error quotes key material: %v", err)
			}
		})
	}
}

func TestPostQuantumKey(t *testing.T) {
	id, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	k, err := crypt.ParseKey([]byte("# public key: "+id.Recipient().String()+"\n"+id.String()+"\n"), "pq")
	if err != nil {
		t.Fatal(err)
	}
	if k.ID() != crypt.KeyID(id.Recipient().String()) {
		t.Fatalf("ID = %s", k.ID())
	}
	r := crypt.NewKeyring(k)
	obj, info := encrypt(t, r, []byte("post-quantum"))
	dec, err := r.Decrypt(bytes.NewReader(obj), info, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(dec); string(got) != "post-quantum" {
		t.Fatalf("got %q", got)
	}
}

func TestKeyringIDs(t *testing.T) {
	a, b := crypttest.Key(t), crypttest.Key(t)
	r := crypt.NewKeyring(a, b, a, b)
	if got := r.IDs(); len(got) != 2 || got[0] != a.ID() || got[1] != b.ID() {
		t.Fatalf("IDs = %v, want [%s %s]", got, a.ID(), b.ID())
	}
	if !r.Encrypting() || r.WriteKeyID() != a.ID() || !r.Has(b.ID()) {
		t.Fatal("the keyring does not write with its first key, or lacks its second")
	}
	var none *crypt.Keyring
	if none.Encrypting() || none.IDs() != nil || none.Has(a.ID()) || none.WriteKeyID() != "" {
		t.Fatal("a nil keyring holds something")
	}
}
