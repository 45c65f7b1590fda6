package crypt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"

	"filippo.io/age"

	"github.com/etcd-manager/etcd-manager/internal/secretfile"
)

// Scheme is the only encryption scheme: age.
const Scheme = "age"

// MaxKeyFileSize bounds a key file: age-keygen writes about 190 bytes, and
// about 2.2 KB for a post-quantum key.
const MaxKeyFileSize = 64 << 10

// Errors. Check them with errors.Is.
var (
	// ErrNoKey means an object is encrypted with a key this process does
	// not hold (see NoKeyError).
	ErrNoKey = errors.New("crypt: key not held")
	// ErrCorrupt means an object does not decrypt: it was damaged,
	// truncated, tampered with, or encrypted to another key than its
	// record names.
	ErrCorrupt = errors.New("crypt: object does not decrypt")
	// ErrKeyFile means a key file cannot be used.
	ErrKeyFile = errors.New("crypt: unusable key file")
)

// Info is what an encrypted object records about its encryption.
type Info struct {
	Scheme string `json:"scheme"`
	KeyID  string `json:"keyId"`
}

var keyIDRE = regexp.MustCompile(`^age:[0-9a-f]{16}$`)

// Validate checks an Info read from the store.
func (i Info) Validate() error {
	switch {
	case i.Scheme != Scheme:
		return fmt.Errorf("encryption scheme %q is not %q, the only one this etcd-manager knows", short(i.Scheme), Scheme)
	case !keyIDRE.MatchString(i.KeyID):
		return fmt.Errorf("encryption key ID %q is not of the form age:<16 hex digits>", short(i.KeyID))
	}
	return nil
}

// short bounds a string read from the store, or an error about it, for
// a message.
func short(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// Key is one age identity, with its recipient and ID.
type Key struct {
	id        string
	identity  age.Identity
	recipient age.Recipient
}

// ID is the key's ID: "age:" and the first 16 hex digits of the sha256 of
// its recipient (its public key, "age1…").
func (k *Key) ID() string { return k.id }

// String is the key's ID, never its secret.
func (k *Key) String() string { return k.id }

// GoString is the key's ID, so that %#v cannot print the secret either.
func (k *Key) GoString() string { return "crypt.Key(" + k.id + ")" }

// LogValue logs the key's ID only.
func (k *Key) LogValue() slog.Value { return slog.StringValue(k.id) }

// KeyID is the ID of the key whose recipient is recipient ("age1…").
func KeyID(recipient string) string {
	sum := sha256.Sum256([]byte(recipient))
	return "age:" + hex.EncodeToString(sum[:8])
}

// LoadKeyFile reads a key file: one age identity (AGE-SECRET-KEY-1… or
// AGE-SECRET-KEY-PQ-1…), with comment lines, as age-keygen writes it. The
// file must be a regular file that neither group nor others may access,
// and at most MaxKeyFileSize bytes (see secretfile.Check: a Kubernetes
// Secret under the pod's fsGroup passes too). Errors name the file, never its
// contents.
func LoadKeyFile(path string) (*Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	defer f.Close()
	// The file opened is the file checked: no race with a rename.
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	if err := secretfile.Check(f, path); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	switch {
	case st.Size() > MaxKeyFileSize:
		return nil, fmt.Errorf("%w: %s is %d bytes, over the %d a key file may be (age-keygen writes one key of about 190 bytes)",
			ErrKeyFile, path, st.Size(), MaxKeyFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxKeyFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrKeyFile, path, err)
	}
	if len(data) > MaxKeyFileSize {
		return nil, fmt.Errorf("%w: %s grew past %d bytes while it was read", ErrKeyFile, path, MaxKeyFileSize)
	}
	return ParseKey(data, path)
}

// ParseKey parses a key file's contents; name labels errors, which never
// quote the contents.
func ParseKey(data []byte, name string) (*Key, error) {
	ids, err := age.ParseIdentities(bytes.NewReader(data))
	if err != nil {
		// age's errors name the line, never the key material.
		hint := ""
		if bytes.Contains(data, []byte("age1")) && !bytes.Contains(data, []byte("AGE-SECRET-KEY-")) {
			hint = " (it looks like a public key: give the file age-keygen wrote, with its AGE-SECRET-KEY- line)"
		}
		return nil, fmt.Errorf("%w: %s holds no usable age key: %v%s; make one with age-keygen -o FILE", ErrKeyFile, name, err, hint)
	}
	if len(ids) != 1 {
		return nil, fmt.Errorf("%w: %s holds %d keys; give one key per file", ErrKeyFile, name, len(ids))
	}
	var rcpt interface {
		age.Recipient
		String() string
	}
	switch id := ids[0].(type) {
	case *age.X25519Identity:
		rcpt = id.Recipient()
	case *age.HybridIdentity:
		rcpt = id.Recipient()
	default:
		return nil, fmt.Errorf("%w: %s holds a kind of age key this etcd-manager does not use", ErrKeyFile, name)
	}
	return &Key{id: KeyID(rcpt.String()), identity: ids[0], recipient: rcpt}, nil
}

// Keyring is the keys of one process: the one it encrypts with, if any,
// and every key it may decrypt with. A nil Keyring holds no key: it
// writes plaintext and reads only plaintext. It is safe for concurrent
// use.
type Keyring struct {
	write *Key
	keys  []*Key
}

// NewKeyring returns a keyring that encrypts with write (none when nil)
// and decrypts with write and read. A key given twice counts once.
func NewKeyring(write *Key, read ...*Key) *Keyring {
	r := &Keyring{write: write}
	for _, k := range append([]*Key{write}, read...) {
		if k != nil && !slices.ContainsFunc(r.keys, func(h *Key) bool { return h.id == k.id }) {
			r.keys = append(r.keys, k)
		}
	}
	return r
}

// Encrypting reports whether the keyring encrypts what is written.
func (r *Keyring) Encrypting() bool { return r != nil && r.write != nil }

// WriteKeyID is the ID of the key written with, "" when none.
func (r *Keyring) WriteKeyID() string {
	if !r.Encrypting() {
		return ""
	}
	return r.write.id
}

// WriteInfo is the Info of what the keyring encrypts, nil when it does
// not encrypt.
func (r *Keyring) WriteInfo() *Info {
	if !r.Encrypting() {
		return nil
	}
	return &Info{Scheme: Scheme, KeyID: r.write.id}
}

// IDs are the IDs of the keys held, the writing key first.
func (r *Keyring) IDs() []string {
	if r == nil {
		return nil
	}
	out := make([]string, 0, len(r.keys))
	for _, k := range r.keys {
		out = append(out, k.id)
	}
	return out
}

// Has reports whether the keyring holds the key id.
func (r *Keyring) Has(id string) bool { return slices.Contains(r.IDs(), id) }

func (r *Keyring) find(id string) *Key {
	if r == nil {
		return nil
	}
	for _, k := range r.keys {
		if k.id == id {
			return k
		}
	}
	return nil
}

// NoKeyError is ErrNoKey with what is known: the object, the key it needs
// and the keys held.
type NoKeyError struct {
	Object string
	KeyID  string
	Held   []string
}

func (e *NoKeyError) Error() string {
	held := "no key is configured here"
	if len(e.Held) > 0 {
		held = "the keys here are [" + strings.Join(e.Held, ", ") + "]"
	}
	return fmt.Sprintf("%s is encrypted with key %s; %s", e.Object, e.KeyID, held)
}

// Is makes errors.Is(err, ErrNoKey) hold.
func (e *NoKeyError) Is(target error) bool { return target == ErrNoKey }

// Check reports whether the object described by info (nil: plaintext)
// can be decrypted here: a *NoKeyError when its key is not held.
func (r *Keyring) Check(object string, info *Info) error {
	if info == nil {
		return nil
	}
	if err := info.Validate(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, object, err)
	}
	if r.find(info.KeyID) == nil {
		return &NoKeyError{Object: object, KeyID: info.KeyID, Held: r.IDs()}
	}
	return nil
}

// Encrypt returns a writer that encrypts what is written to it into dst,
// and the Info to record beside the object; Close writes the last chunk.
// It writes age's header to dst before it returns.
// A keyring that does not encrypt passes what is written through, and
// the Info is nil.
func (r *Keyring) Encrypt(dst io.Writer) (io.WriteCloser, *Info, error) {
	if !r.Encrypting() {
		return nopCloser{dst}, nil, nil
	}
	w, err := age.Encrypt(dst, r.write.recipient)
	if err != nil {
		return nil, nil, fmt.Errorf("crypt: encrypt: %w", err)
	}
	return w, r.WriteInfo(), nil
}

// EncryptReader is Encrypt for a reader: reading it reads src and yields
// the object.
func (r *Keyring) EncryptReader(src io.Reader) (io.Reader, *Info, error) {
	if !r.Encrypting() {
		return src, nil, nil
	}
	er, err := age.EncryptReader(src, r.write.recipient)
	if err != nil {
		return nil, nil, fmt.Errorf("crypt: encrypt: %w", err)
	}
	return er, r.WriteInfo(), nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// Decrypt returns the plaintext of the object read from src, which info
// describes (nil: plaintext, returned as it is); object labels errors.
// It reads age's header at once: a key not held is a *NoKeyError before
// anything is read, and an object not encrypted to the key its record
// names wraps ErrCorrupt. Reading the plaintext then fails with
// ErrCorrupt at the first chunk that does not authenticate, or where
// the object is cut short; src's own errors are returned as they are.
// io.EOF comes only once the last chunk has authenticated.
func (r *Keyring) Decrypt(src io.Reader, info *Info, object string) (io.Reader, error) {
	if info == nil {
		return src, nil
	}
	if err := r.Check(object, info); err != nil {
		return nil, err
	}
	rec := &srcErr{r: src}
	dec, err := age.Decrypt(rec, r.find(info.KeyID).identity)
	if err != nil {
		if rec.err != nil {
			return nil, rec.err
		}
		var noMatch *age.NoIdentityMatchError
		if errors.As(err, &noMatch) {
			return nil, fmt.Errorf("%w: %s is not encrypted to key %s, though its record says so", ErrCorrupt, object, info.KeyID)
		}
		return nil, fmt.Errorf("%w: %s: %s", ErrCorrupt, object, short(err.Error()))
	}
	return &plainReader{r: dec, src: rec, object: object}, nil
}

// srcErr remembers the error of the reader it wraps, other than EOF: it
// tells the store's faults from the object's.
type srcErr struct {
	r   io.Reader
	err error
}

func (s *srcErr) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		s.err = err
	}
	return n, err
}

type plainReader struct {
	r      io.Reader
	src    *srcErr
	object string
}

func (p *plainReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if err == nil || err == io.EOF {
		return n, err
	}
	if p.src.err != nil {
		return n, p.src.err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return n, fmt.Errorf("%w: %s is cut short", ErrCorrupt, p.object)
	}
	return n, fmt.Errorf("%w: %s: %s", ErrCorrupt, p.object, short(err.Error()))
}
