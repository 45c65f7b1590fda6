package store

// The blob drivers for the cloud schemes register their URL openers here,
// so every binary that opens a store understands all of them.
import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"

	_ "gocloud.dev/blob/azureblob" // azblob://container
	_ "gocloud.dev/blob/gcsblob"   // gs://bucket
	_ "gocloud.dev/blob/s3blob"    // s3://bucket
)

// Schemes are the URL schemes of the stores Open understands.
var Schemes = []string{"file", "s3", "gs", "azblob"}

// urlForms shows the URL of each scheme, for error messages.
const urlForms = "file:///path, s3://bucket/prefix, gs://bucket/prefix or azblob://container/prefix"

// parseURL parses a store URL and refuses, as ErrBadURL, one that no
// driver could open: a store with another scheme does not become
// reachable by retrying.
func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadURL, rawURL, err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w %q: missing scheme; use %s", ErrBadURL, rawURL, urlForms)
	}
	if !slices.Contains(Schemes, u.Scheme) {
		return nil, fmt.Errorf("%w %q: unsupported scheme %q; the schemes are %s: use %s", ErrBadURL, rawURL, u.Scheme, strings.Join(Schemes, ", "), urlForms)
	}
	if u.Fragment != "" || strings.HasSuffix(rawURL, "#") {
		return nil, fmt.Errorf("%w %q: it has a fragment (#%s); a # in a path must be written %%23", ErrBadURL, rawURL, u.Fragment)
	}
	return u, nil
}

// Identity is a short name of the store at rawURL, the same for every
// spelling of its URL that names the same bucket (or folder) and prefix:
// its scheme, bucket and cleaned path, without the query (endpoints,
// regions, credentials), hashed. Node certificates carry it (see
// pki.StoreMarker): agents take calls only from nodes of their store.
func Identity(rawURL string) (string, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return "", err
	}
	key := u.Scheme + "://" + strings.ToLower(u.Host) + path.Clean("/"+strings.Trim(u.Path, "/"))
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8]), nil
}

// CheckURL checks a store URL's form without opening the store, for a
// configuration's Validate: its scheme, and for a file URL an absolute
// path, for the others a bucket or container name. The error wraps
// ErrBadURL.
func CheckURL(rawURL string) error {
	u, err := parseURL(rawURL)
	if err != nil {
		return err
	}
	if u.Scheme == "file" {
		_, err := fileDir(u, rawURL)
		return err
	}
	if _, err := cloudBucketURL(u); err != nil {
		return fmt.Errorf("%w %q: %v", ErrBadURL, rawURL, err)
	}
	return nil
}
