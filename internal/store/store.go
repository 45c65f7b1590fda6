package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/gcerrors"
	"gocloud.dev/gcp"
	"golang.org/x/oauth2/google"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Keys of the control objects, relative to the store's root.
const (
	KeySpec    = "control/etcd-cluster-spec"
	KeyCreated = "control/etcd-cluster-created"
	// KeyOwner is our addition: the Kubernetes object that writes the
	// spec (see spec.ClusterOwner).
	KeyOwner = "control/etcd-cluster-owner"
)

// Errors. Check them with errors.Is.
var (
	ErrNotFound    = errors.New("store: object not found")
	ErrExists      = errors.New("store: object already exists")
	ErrUnreachable = errors.New("store: backup store unreachable")
	ErrBadURL      = errors.New("store: invalid backup store URL")
	// ErrTooLarge means an object is larger than any valid one of its
	// kind: it is refused unread, and named.
	ErrTooLarge = errors.New("store: object is too large")
	// ErrBadKey means a key a file:// store cannot hold as its own file
	// name; retrying does not help.
	ErrBadKey = errors.New("store: invalid object key")
	// ErrDenied and ErrNoBucket are the store refusing the credentials
	// it was given, and its bucket or container missing. Both wrap
	// ErrUnreachable as well (the agents wait for the store either way),
	// but trying again as it is cannot help: see Permanent.
	ErrDenied   = errors.New("store: access denied")
	ErrNoBucket = errors.New("store: no such bucket or container")
	// ErrNoCredentials is the driver finding no credentials at all; it
	// wraps ErrUnreachable as well, and is Permanent.
	ErrNoCredentials = errors.New("store: no credentials found")
)

// Permanent reports whether err, from opening a store, is one that
// trying again as it is cannot fix: a bad URL, credentials refused or
// missing, a bucket or container missing.
func Permanent(err error) bool {
	return errors.Is(err, ErrBadURL) || errors.Is(err, ErrDenied) || errors.Is(err, ErrNoBucket) || errors.Is(err, ErrNoCredentials)
}

// refusal is an error of opening a store that names what to fix: it is
// its kind (ErrDenied, ErrNoBucket, ErrNoCredentials) and ErrUnreachable,
// for the agents, which wait for the store either way, while its message
// names only its kind: a store that refuses the credentials answered.
type refusal struct {
	kind error
	msg  string
}

func (e *refusal) Error() string        { return e.kind.Error() + ": " + e.msg }
func (e *refusal) Is(target error) bool { return target == e.kind || target == ErrUnreachable }

func refused(kind error, format string, args ...any) error {
	return &refusal{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// What the SDKs say when they find no credentials, or no region: they
// give these no error code of their own.
var (
	noCredentialsTexts = []string{"get credentials", "failed to refresh cached credentials", "no EC2 IMDS role",
		"could not find default credentials", "Options.AccountName is required", "DefaultAzureCredential"}
	noRegionTexts = []string{"Invalid region", "Missing Region", "region was not a valid DNS name"}
)

// setupFault classifies a driver's error that is its own set-up failing
// (credentials, region) rather than the store: nil when it is not.
func setupFault(scheme, rawURL string, err error) error {
	msg := err.Error()
	has := func(texts []string) bool {
		return slices.ContainsFunc(texts, func(t string) bool { return strings.Contains(msg, t) })
	}
	switch {
	case scheme == "s3" && has(noRegionTexts):
		return fmt.Errorf("%w %q: %v; set the bucket's region with ?region= in the URL or AWS_REGION", ErrBadURL, rawURL, err)
	case has(noCredentialsTexts):
		return refused(ErrNoCredentials, "open %s: %v; %s", rawURL, err, credentialsHint(scheme))
	}
	return nil
}

// httpStatus is the HTTP status of a driver's error that carries one
// (S3's: gocloud maps only some of them to codes, not a signature or a
// key refused), or 0.
func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	var az *azcore.ResponseError
	if errors.As(err, &az) {
		return az.StatusCode
	}
	return 0
}

// brief is a driver's error on one line. Azure's spans a dozen lines,
// with the response's body: it is told by its request, status and error
// code instead.
func brief(err error) string {
	var az *azcore.ResponseError
	if errors.As(err, &az) {
		req := ""
		if r := az.RawResponse; r != nil && r.Request != nil && r.Request.URL != nil {
			// Without the query, which may hold a SAS token.
			req = r.Request.Method + " " + r.Request.URL.Scheme + "://" + r.Request.URL.Host + r.Request.URL.Path + ": "
		}
		return fmt.Sprintf("%sHTTP %d %s", req, az.StatusCode, az.ErrorCode)
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// credentialsHint says where a scheme's driver finds its credentials.
func credentialsHint(scheme string) string {
	switch scheme {
	case "s3":
		return "the S3 driver reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the instance's role), and the region from ?region= or AWS_REGION"
	case "gs":
		return "the GCS driver reads GOOGLE_APPLICATION_CREDENTIALS, or the machine's service account"
	case "azblob":
		return "the Azure driver reads AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN (or a managed identity)"
	}
	return ""
}

// Size limits of the small objects the agents and the ctl read, far above
// any valid one: whatever is read from the store is bounded.
const (
	MaxSpecSize    = 64 << 10
	MaxMarkerSize  = 4 << 10
	MaxCommandSize = 64 << 10
	MaxStatusSize  = 256 << 10
	MaxRecordSize  = 16 << 10
)

// Options control how a store is opened.
type Options struct {
	// Create makes a file:// store's directory if it is missing. Readers
	// leave it false so that a typo in the URL is reported, not created.
	Create bool
}

// Store is an opened backup store. It is safe for concurrent use.
type Store struct {
	url    string
	bucket *blob.Bucket
	// dir is the root directory of a file:// store, for the operations
	// that fileblob cannot do atomically across processes; confined says
	// every object is opened beneath it, following no link out of it
	// (see openRoot).
	dir      string
	confined bool
	// realDir is dir with any link that the URL allows resolved.
	realDir string
}

// Open opens the store at rawURL: file:///path, s3://bucket/prefix,
// gs://bucket/prefix or azblob://container/prefix. Cloud URLs take their
// driver's query parameters (for S3: endpoint, region, use_path_style) and
// read credentials from the driver's usual environment variables. A gs://
// store goes to the emulator at STORAGE_EMULATOR_HOST if that is set.
func Open(ctx context.Context, rawURL string, opts Options) (*Store, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "file" {
		return openFile(u, rawURL, opts)
	}
	if u.Scheme == "gs" {
		if err := checkGCSEmulatorHost(os.Getenv(gcsEmulatorHostEnv)); err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrBadURL, rawURL, err)
		}
	}
	bucketURL, err := cloudBucketURL(u)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadURL, rawURL, err)
	}
	var b *blob.Bucket
	switch {
	case u.Scheme == "gs" && u.Query().Get("anonymous") == "true":
		b, err = openGCS(ctx, bucketURL, nil)
	case u.Scheme == "gs" && os.Getenv(gcsEmulatorHostEnv) == "" && os.Getenv(gcsEmulatorHostEnv+"_GRPC") == "":
		creds, cerr := gcp.DefaultCredentials(ctx)
		if cerr != nil {
			return nil, refused(ErrNoCredentials, "open %s: %v; %s", rawURL, cerr, credentialsHint(u.Scheme))
		}
		b, err = openGCS(ctx, bucketURL, creds)
	default:
		b, err = blob.OpenBucket(ctx, bucketURL)
	}
	if err != nil {
		if strings.Contains(err.Error(), "query parameter") {
			return nil, fmt.Errorf("%w %q: %v", ErrBadURL, rawURL, err)
		}
		// Nothing has gone over the network yet: the driver's set-up
		// (its credentials, its account) is what failed.
		if f := setupFault(u.Scheme, rawURL, err); f != nil {
			return nil, f
		}
		return nil, refused(ErrDenied, "open %s: %s; %s", rawURL, brief(err), credentialsHint(u.Scheme))
	}
	// A missing bucket reads as "not found" object by object, which would
	// look like an empty store; find out now instead.
	checkCtx, cancel := context.WithTimeout(ctx, openCheckTimeout)
	defer cancel()
	ok, err := b.IsAccessible(checkCtx)
	if err != nil || !ok {
		b.Close()
		switch code := gcerrors.Code(err); {
		case err == nil || code == gcerrors.NotFound || httpStatus(err) == 404:
			return nil, refused(ErrNoBucket, "%s: bucket or container %q does not exist; create it first", rawURL, u.Host)
		case code == gcerrors.PermissionDenied || httpStatus(err) == 401 || httpStatus(err) == 403:
			return nil, refused(ErrDenied, "open %s: %s; %s", rawURL, brief(err), credentialsHint(u.Scheme))
		case setupFault(u.Scheme, rawURL, err) != nil:
			return nil, setupFault(u.Scheme, rawURL, err)
		case code == gcerrors.InvalidArgument:
			return nil, fmt.Errorf("%w %q: %s; %s", ErrBadURL, rawURL, brief(err), credentialsHint(u.Scheme))
		}
		return nil, fmt.Errorf("%w: open %s: %s", ErrUnreachable, rawURL, brief(err))
	}
	return &Store{url: rawURL, bucket: b}, nil
}

// openGCS opens a gs:// bucket URL with creds, the credentials Google's
// libraries find (GOOGLE_APPLICATION_CREDENTIALS, gcloud's file, the
// machine's service account). gocloud's own opener would, without them,
// print a warning on stdout and go on with none, asking the GCE metadata
// server first; Open says instead that there are none, and what to set.
// With nil creds (?anonymous=true) it sends no credentials.
func openGCS(ctx context.Context, bucketURL string, creds *google.Credentials) (*blob.Bucket, error) {
	opener := &gcsblob.URLOpener{Client: gcp.NewAnonymousHTTPClient(gcp.DefaultTransport())}
	if creds != nil {
		ts := gcp.CredentialsTokenSource(creds)
		client, err := gcp.NewHTTPClient(gcp.DefaultTransport(), ts)
		if err != nil {
			return nil, err
		}
		opener = &gcsblob.URLOpener{Client: client, TokenSource: ts}
	}
	mux := new(blob.URLMux)
	mux.RegisterBucket(gcsblob.Scheme, opener)
	return mux.OpenBucket(ctx, bucketURL)
}

// gcsEmulatorHostEnv names the variable that points gs:// stores at a GCS
// emulator (such as fake-gcs-server) instead of Google Cloud Storage. When
// it is set, gocloud's gcsblob sends every request to http://HOST:PORT
// without authentication, and looks for no credentials: it neither reads
// Application Default Credentials nor asks the GCE metadata server.
const gcsEmulatorHostEnv = "STORAGE_EMULATOR_HOST"

// checkGCSEmulatorHost refuses an emulator address that gcsblob would
// mangle. gcsblob puts "http://" in front of the value as it is, so
// "http://127.0.0.1:4443" would become requests to a host named "http",
// looked up in DNS, rather than a clear error.
func checkGCSEmulatorHost(host string) error {
	if strings.Contains(host, "/") {
		return fmt.Errorf("%s=%q: give the emulator as HOST:PORT, without a scheme or a path, as in 127.0.0.1:4443 (it is always spoken to over plain HTTP)", gcsEmulatorHostEnv, host)
	}
	return nil
}

// uploadPartSize is the part (or block) size of multipart uploads.
const uploadPartSize = 5 << 20

// openCheckTimeout bounds the probe Open makes of a cloud store.
const openCheckTimeout = 20 * time.Second

// cloudBucketURL turns a store URL in the kops form, in which the path
// under the bucket is the store's root (s3://bucket/cluster/backups/etcd/main),
// into the bucket URL gocloud opens: the path moves into its "prefix"
// parameter, and the query (endpoint, region, ...) passes through.
func cloudBucketURL(u *url.URL) (string, error) {
	if u.Host == "" {
		return "", fmt.Errorf("no bucket or container name; use %s://NAME/optional/prefix", u.Scheme)
	}
	root := strings.Trim(u.Path, "/")
	if root == "" {
		return u.String(), nil
	}
	q := u.Query()
	if q.Has("prefix") {
		return "", errors.New("give the prefix either as the URL's path or as ?prefix=, not both")
	}
	q.Set("prefix", root+"/")
	c := *u
	c.Path, c.RawPath, c.RawQuery = "", "", q.Encode()
	return c.String(), nil
}

// fileDir is the directory of a file URL, which must be absolute.
func fileDir(u *url.URL, rawURL string) (string, error) {
	if (u.Host != "" && u.Host != "localhost") || !filepath.IsAbs(u.Path) {
		return "", fmt.Errorf("%w %q: a file URL needs an absolute path, as in file:///var/lib/etcd-backups", ErrBadURL, rawURL)
	}
	for k, v := range u.Query() {
		if k != rootSymlinkParam || len(v) != 1 || v[0] != "allow" {
			return "", fmt.Errorf("%w %q: a file URL takes no query but %s=allow", ErrBadURL, rawURL, rootSymlinkParam)
		}
	}
	return filepath.Clean(u.Path), nil
}

// rootSymlinkParam=allow in a file URL lets the store's directory be
// reached through a symbolic link.
const rootSymlinkParam = "root-symlink"

func openFile(u *url.URL, rawURL string, opts Options) (*Store, error) {
	dir, err := fileDir(u, rawURL)
	if err != nil {
		return nil, err
	}
	if opts.Create {
		// The store holds every key of etcd, and pki/ the CA's key: only
		// its owner may enter it.
		if err := os.MkdirAll(dir, fileDirMode); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, rawURL, err)
		}
	}
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%w: %s: directory %s does not exist", ErrUnreachable, rawURL, dir)
	case err != nil:
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, rawURL, err)
	case !st.IsDir():
		return nil, fmt.Errorf("%w: %s: %s is not a directory", ErrUnreachable, rawURL, dir)
	}
	// Whoever could plant a link in place of the store's directory, or of
	// one on the way to it, would have the agents write every key of etcd
	// elsewhere: a link is followed only when the URL says so.
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, rawURL, err)
	}
	if real != dir && u.Query().Get(rootSymlinkParam) != "allow" {
		return nil, fmt.Errorf("%w %q: the directory is reached through a symbolic link, to %s: give that path, or add ?%s=allow to the URL if the link is meant", ErrBadURL, rawURL, real, rootSymlinkParam)
	}
	// metadata=skip keeps the tree free of fileblob's ".attrs" sidecars, so
	// it holds exactly the objects of the store format.
	// NoTempDir writes temporary files beside their objects, so the store
	// may live on another file system than /tmp.
	b, err := fileblob.OpenBucket(dir, &fileblob.Options{Metadata: fileblob.MetadataDontWrite, NoTempDir: true, DirFileMode: fileDirMode})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, rawURL, err)
	}
	return &Store{url: rawURL, bucket: b, dir: dir, confined: true, realDir: real}, nil
}

// URL is the URL the store was opened from.
func (s *Store) URL() string { return s.url }

// Close releases the store.
func (s *Store) Close() error { return s.bucket.Close() }

// openRoot opens a file:// store's folder, for one operation: the
// paths of its objects are opened beneath it. It is opened again each
// time, as fileblob looks each path up again, so that a folder remounted
// or made anew is the one used. A folder that cannot be opened is the
// store unreachable, never an object not found.
func (s *Store) openRoot() (*os.Root, error) {
	root, err := os.OpenRoot(s.dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: the store's folder: %v", ErrUnreachable, s.url, err)
	}
	return root, nil
}

// Read returns the object at key, or an error wrapping ErrNotFound.
func (s *Store) Read(ctx context.Context, key string) ([]byte, error) {
	r, _, err := s.newReader(ctx, key)
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	return data, nil
}

// ReadMax returns the object at key, refusing one larger than max bytes
// with an error wrapping ErrTooLarge that names it; a missing object wraps
// ErrNotFound.
func (s *Store) ReadMax(ctx context.Context, key string, max int64) ([]byte, error) {
	r, size, err := s.newReader(ctx, key)
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	defer r.Close()
	if size > max {
		return nil, fmt.Errorf("%w: %s in %s is %d bytes; no valid one is over %d", ErrTooLarge, key, s.url, size, max)
	}
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: %s in %s is over %d bytes", ErrTooLarge, key, s.url, max)
	}
	return data, nil
}

// ModTime is when the object at key was last written, by the store's
// clock: HTTP stores keep it to the second.
func (s *Store) ModTime(ctx context.Context, key string) (time.Time, error) {
	if s.confined && !validKey(key) {
		if err := s.checkEscaped(ctx, key); err != nil {
			return time.Time{}, s.wrap("stat", key, err)
		}
	} else if s.confined {
		f, st, err := s.openFile(key)
		if err != nil {
			return time.Time{}, s.wrap("stat", key, err)
		}
		f.Close()
		return st.ModTime(), nil
	}
	a, err := s.bucket.Attributes(ctx, key)
	if err != nil {
		return time.Time{}, s.wrap("stat", key, err)
	}
	return a.ModTime, nil
}

// Reader streams the object at key; a missing object wraps ErrNotFound.
// The caller closes it.
func (s *Store) Reader(ctx context.Context, key string) (io.ReadCloser, error) {
	r, _, err := s.newReader(ctx, key)
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	return r, nil
}

// newReader opens the object at key, and says its size: a file:// store's
// beneath its root (see openFile), the others' through their driver.
func (s *Store) newReader(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	opts := readerOptions
	if s.confined {
		if validKey(key) {
			f, st, err := s.openFile(key)
			if err != nil {
				return nil, 0, err
			}
			return f, st.Size(), nil
		}
		// A key this store never writes, which another tool wrote
		// through fileblob under an escaped file name: fileblob opens
		// it, and the file it opened must be beneath the store.
		opts = &blob.ReaderOptions{BeforeRead: func(as func(any) bool) error {
			var f *os.File
			if !as(&f) {
				return fmt.Errorf("store: %s: cannot tell where fileblob opened it", key)
			}
			return s.beneath(key, f)
		}}
	}
	r, err := s.bucket.NewReader(ctx, key, opts)
	if err != nil {
		return nil, 0, err
	}
	return r, r.Size(), nil
}

// checkEscaped checks that the file of a key this store never writes,
// which fileblob names with its escapes, is beneath the store.
func (s *Store) checkEscaped(ctx context.Context, key string) error {
	r, _, err := s.newReader(ctx, key)
	if err != nil {
		return err
	}
	return r.Close()
}

// beneath checks that f, opened for key, is a file beneath the store's
// folder, as its file descriptor's path says.
func (s *Store) beneath(key string, f *os.File) error {
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return fmt.Errorf("store: %s: %w", key, err)
	}
	if !strings.HasPrefix(p, s.realDir+string(filepath.Separator)) {
		return fmt.Errorf("store: %s leads out of the store through a symbolic link, to %s: refused", key, p)
	}
	return nil
}

// openFile opens the object at a valid key of a file:// store beneath
// its root, and says what it is: a symbolic link on the way that leads
// out of the store fails the read, as does a key that is no file (a
// directory).
func (s *Store) openFile(key string) (*os.File, os.FileInfo, error) {
	root, err := s.openRoot()
	if err != nil {
		return nil, nil, err
	}
	defer root.Close()
	f, err := root.Open(filepath.FromSlash(key))
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s is not a file", fs.ErrNotExist, key)
	}
	return f, st, nil
}

// Write replaces the object at key. Readers see the old or the new object,
// never a part of one.
func (s *Store) Write(ctx context.Context, key string, data []byte) error {
	if err := s.put(ctx, key, bytes.NewReader(data), false); err != nil {
		return s.wrap("write", key, err)
	}
	return nil
}

// Put streams r into a new object at key. The object appears, whole, only
// if r reaches EOF and the upload completes; if r fails or ctx ends first,
// nothing is committed.
func (s *Store) Put(ctx context.Context, key string, r io.Reader) error {
	if err := s.put(ctx, key, r, false); err != nil {
		return s.wrap("write", key, err)
	}
	return nil
}

// put uploads through the drivers' Upload path, which takes a reader:
// every driver then commits only on a clean EOF. (The Writer path commits
// whatever was written when Close is called, and azureblob's can panic
// when the upload fails.)
func (s *Store) put(ctx context.Context, key string, r io.Reader, ifNotExist bool) error {
	if s.dir != "" && !ifNotExist {
		return s.putFile(ctx, key, r)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return s.bucket.Upload(ctx, key, &abortOnError{ctx: ctx, r: r, abort: cancel}, &blob.WriterOptions{
		ContentType: "application/octet-stream",
		IfNotExist:  ifNotExist,
		// Parts of 5 MiB (S3's smallest), two in flight (one for S3, see
		// smallUploads): memory stays small and flat whatever the
		// object's size. S3 allows 10000 parts; the SDK grows the part
		// size for larger objects.
		BufferSize:     uploadPartSize,
		MaxConcurrency: 2,
		BeforeWrite:    s.smallUploads,
	})
}

// readerOptions are every read's. S3's SDK would print a warning of its
// own, outside the logs, for each read of an object uploaded in parts:
// S3 keeps no checksum of the whole object to check it against. That is
// expected, and the store's readers check what matters (a backup's
// sha256, a segment's digest).
var readerOptions = &blob.ReaderOptions{BeforeRead: func(as func(any) bool) error {
	var opts *[]func(*s3.Options)
	if as(&opts) {
		*opts = append(*opts, func(o *s3.Options) { o.DisableLogOutputChecksumValidationSkipped = true })
	}
	return nil
}}

// smallUploads sets S3's transfer manager to go multipart from the first
// part, with one part in flight. By default it reads the first 16 MiB of
// an object whole (to decide between one PUT and a multipart upload)
// before it uses its pool of parts, which puts 16 MiB more in memory for
// every large upload. An object under one part still goes in one PUT.
// Other drivers have nothing of the kind.
func (s *Store) smallUploads(as func(any) bool) error {
	var tm *transfermanager.Client
	var client *s3.Client
	if !as(&tm) || !s.bucket.As(&client) {
		return nil
	}
	*tm = *transfermanager.New(client, func(o *transfermanager.Options) {
		// gocloud passes the bucket's checksum setting (the URL's
		// requestChecksumCalculation) to both; keep it.
		o.RequestChecksumCalculation = client.Options().RequestChecksumCalculation
		o.PartSizeBytes = uploadPartSize
		// One part uploads while the next fills: the manager holds one
		// part more than its concurrency. With two in flight its three
		// parts (15 MiB) left the agent's heap at its soft memory limit,
		// and the collector ran about once per MiB of a backup
		// (docs/memory.md).
		o.Concurrency = 1
		o.MultipartUploadThreshold = uploadPartSize
	})
	return nil
}

// abortOnError cancels the upload's context as soon as the source fails,
// before the driver can see the error as a short object.
type abortOnError struct {
	ctx   context.Context
	r     io.Reader
	abort context.CancelFunc
}

func (a *abortOnError) Read(p []byte) (int, error) {
	if err := a.ctx.Err(); err != nil {
		return 0, err // some drivers copy without watching ctx
	}
	n, err := a.r.Read(p)
	if err != nil && err != io.EOF {
		a.abort()
	}
	return n, err
}

// Create writes the object at key only if no object is there yet; if one
// is, it returns an error wrapping ErrExists. Exactly one of several
// concurrent callers, in any process, succeeds.
func (s *Store) Create(ctx context.Context, key string, data []byte) error {
	if s.dir != "" {
		return s.createFile(key, data)
	}
	err := s.put(ctx, key, bytes.NewReader(data), true)
	if gcerrors.Code(err) == gcerrors.FailedPrecondition {
		return fmt.Errorf("%w: %s", ErrExists, key)
	}
	if err != nil {
		return s.wrap("create", key, err)
	}
	return nil
}

// CreateFrom is Create for an object streamed from r: it appears, whole,
// only if r reaches EOF and no object was at key.
func (s *Store) CreateFrom(ctx context.Context, key string, r io.Reader) error {
	if s.dir != "" {
		return s.createFileFrom(key, r)
	}
	err := s.put(ctx, key, r, true)
	if gcerrors.Code(err) == gcerrors.FailedPrecondition {
		return fmt.Errorf("%w: %s", ErrExists, key)
	}
	if err != nil {
		return s.wrap("create", key, err)
	}
	return nil
}

// createFile is Create for file:// stores. fileblob's IfNotExist checks and
// renames under an in-process lock only, so two agents sharing a directory
// could both win; a hard link fails atomically if the name exists.
func (s *Store) createFile(key string, data []byte) error {
	return s.createFileFrom(key, bytes.NewReader(data))
}

func (s *Store) createFileFrom(key string, r io.Reader) error {
	root, err := s.openRoot()
	if err != nil {
		return err
	}
	defer root.Close()
	path, tmp, err := s.writeTemp(context.Background(), root, key, r)
	if err != nil {
		return s.wrap("create", key, err)
	}
	defer root.Remove(tmp)
	if err := root.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, key)
		}
		return s.wrap("create", key, err)
	}
	if err := syncDir(root, filepath.Dir(path)); err != nil {
		return s.wrap("create", key, err)
	}
	return nil
}

// putFile is put for file:// stores: the object is written to a
// temporary file of mode 0600 beside it, synced, and renamed over it
// only once r reaches EOF.
func (s *Store) putFile(ctx context.Context, key string, r io.Reader) error {
	root, err := s.openRoot()
	if err != nil {
		return err
	}
	defer root.Close()
	path, tmp, err := s.writeTemp(ctx, root, key, r)
	if err != nil {
		return err
	}
	defer root.Remove(tmp)
	if err := root.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(root, filepath.Dir(path))
}

// syncDir makes a rename or link in dir, beneath root, durable.
func syncDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// writeTemp writes r, whole and synced, to a temporary file of mode 0600
// beside key's path, and returns both paths, relative to the store's
// root. The directories it makes are 0700. Every path is opened beneath
// the root: a symbolic link on the way that leads out of the store fails
// the write, and nothing is written outside it.
func (s *Store) writeTemp(ctx context.Context, root *os.Root, key string, r io.Reader) (path, tmp string, err error) {
	if !validKey(key) {
		return "", "", fmt.Errorf("%w %q: it would leave the store, or be written under another file name than it is read from", ErrBadKey, key)
	}
	path = filepath.FromSlash(key)
	if err := root.MkdirAll(filepath.Dir(path), fileDirMode); err != nil {
		return "", "", err
	}
	f, tmp, err := createTemp(root, filepath.Dir(path))
	if err != nil {
		return "", "", err
	}
	// Large writes (on Linux, where writeback wraps f): io.Copy's 32 KiB
	// would take eight times the system calls for a large object.
	w := writeback(f)
	if _, err := io.CopyBuffer(w, &abortOnError{ctx: ctx, r: r, abort: func() {}}, make([]byte, fileCopyBuffer)); err != nil {
		f.Close()
		root.Remove(tmp)
		return "", "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		root.Remove(tmp)
		return "", "", err
	}
	w.release()
	if err := f.Close(); err != nil {
		root.Remove(tmp)
		return "", "", err
	}
	return path, tmp, nil
}

// createTemp creates a temporary file of mode 0600 in dir, beneath root,
// named as isTempName knows it.
func createTemp(root *os.Root, dir string) (*os.File, string, error) {
	for range 100 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, "", err
		}
		name := filepath.Join(dir, ".create-"+hex.EncodeToString(b[:]))
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, name, err
	}
	return nil, "", fmt.Errorf("store: no free temporary name in %s", dir)
}

// fileblobEscapeRE matches what fileblob could read as one of its
// escapes.
var fileblobEscapeRE = regexp.MustCompile(`__0x[^_]*__`)

// fileCopyBuffer is the size of a file store's writes of an object.
const fileCopyBuffer = 256 << 10

// fileDirMode is the mode of a file:// store's directories; its objects
// are 0600.
const fileDirMode = 0o700

// validKey reports whether key stays inside the store (no empty, . or
// .. segment, and no leading slash) and is its own file name: fileblob,
// which reads and lists the objects written here, escapes control
// characters, a slash after "..", "//", a trailing slash and what looks
// like its escapes (__0x<hex>__) into another name, and reads invalid
// UTF-8 as another string. No key this program makes has any of them.
func validKey(key string) bool {
	if key == "" || !utf8.ValidString(key) || strings.Contains(key, "../") || strings.HasSuffix(key, "/") ||
		fileblobEscapeRE.MatchString(key) || strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 }) {
		return false
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// Delete removes the object at key; a missing object is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	if s.confined && validKey(key) {
		root, err := s.openRoot()
		if err != nil {
			return err
		}
		defer root.Close()
		if err := root.Remove(filepath.FromSlash(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s.wrap("delete", key, err)
		}
		return nil
	}
	if s.confined {
		// A key another tool wrote under fileblob's escapes: deleted
		// through fileblob once its file is found beneath the store.
		if err := s.checkEscaped(ctx, key); errors.Is(err, fs.ErrNotExist) || gcerrors.Code(err) == gcerrors.NotFound {
			return nil
		} else if err != nil {
			return s.wrap("delete", key, err)
		}
	}
	err := s.bucket.Delete(ctx, key)
	if err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return s.wrap("delete", key, err)
	}
	return nil
}

// List returns the keys under prefix, in lexical order. With a delimiter
// of "/", it returns the immediate children instead (directories end in
// "/").
func (s *Store) List(ctx context.Context, prefix, delimiter string) ([]string, error) {
	// A file:// listing walks the directory, and an object written at the
	// same time can vanish between the walk and its stat (its temporary
	// file is renamed, or a merge deletes it). That is no error in the
	// store: list again, backing off a little, as a busy prefix (capture
	// cutting every 200ms while a merge deletes) can race several walks.
	var err error
	delay := 2 * time.Millisecond
	for attempt := range listAttempts {
		var keys []string
		if keys, err = s.list(ctx, prefix, delimiter); err == nil {
			return keys, nil
		}
		if gcerrors.Code(err) != gcerrors.NotFound || attempt == listAttempts-1 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, s.wrap("list", prefix, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
	return nil, s.wrap("list", prefix, err)
}

// listAttempts bounds the walks of one List whose objects vanish under it.
const listAttempts = 10

func (s *Store) list(ctx context.Context, prefix, delimiter string) ([]string, error) {
	var keys []string
	it := s.bucket.List(&blob.ListOptions{Prefix: prefix, Delimiter: delimiter})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			return keys, nil
		}
		if err != nil {
			return nil, err
		}
		if isTempName(obj.Key) {
			continue
		}
		keys = append(keys, obj.Key)
	}
}

// ReadSpec reads the desired cluster spec. A missing spec wraps
// ErrNotFound; an unparsable one names the object.
func (s *Store) ReadSpec(ctx context.Context) (spec.ClusterSpec, error) {
	data, err := s.ReadMax(ctx, KeySpec, MaxSpecSize)
	if err != nil {
		return spec.ClusterSpec{}, err
	}
	cs, err := spec.DecodeClusterSpec(data)
	if err != nil {
		return cs, fmt.Errorf("store: %s in %s: %w", KeySpec, s.url, err)
	}
	return cs, nil
}

// WriteSpec replaces the desired cluster spec.
func (s *Store) WriteSpec(ctx context.Context, cs spec.ClusterSpec) error {
	data, err := jsonLine(cs)
	if err != nil {
		return err
	}
	return s.Write(ctx, KeySpec, data)
}

// ReadCreated reads the creation marker; a missing marker wraps
// ErrNotFound.
func (s *Store) ReadCreated(ctx context.Context) (spec.ClusterCreated, error) {
	data, err := s.ReadMax(ctx, KeyCreated, MaxMarkerSize)
	if err != nil {
		return spec.ClusterCreated{}, err
	}
	c, err := spec.DecodeClusterCreated(data)
	if err != nil {
		return c, fmt.Errorf("store: %s in %s: %w", KeyCreated, s.url, err)
	}
	return c, nil
}

// CreateCreated writes the creation marker if there is none yet. It is
// the once-only step of cluster creation: a marker already there wraps
// ErrExists.
func (s *Store) CreateCreated(ctx context.Context, c spec.ClusterCreated) error {
	data, err := jsonLine(c)
	if err != nil {
		return err
	}
	return s.Create(ctx, KeyCreated, data)
}

// ReadOwner reads the owner record; a missing one wraps ErrNotFound, an
// invalid one names the object.
func (s *Store) ReadOwner(ctx context.Context) (spec.ClusterOwner, error) {
	data, err := s.ReadMax(ctx, KeyOwner, MaxMarkerSize)
	if err != nil {
		return spec.ClusterOwner{}, err
	}
	o, err := spec.DecodeClusterOwner(data)
	if err != nil {
		return o, fmt.Errorf("store: %s in %s: %w", KeyOwner, s.url, err)
	}
	return o, nil
}

// CreateOwner writes the owner record if there is none yet (ErrExists
// otherwise): of two writers that race to own a store, one wins.
func (s *Store) CreateOwner(ctx context.Context, o spec.ClusterOwner) error {
	data, err := jsonLine(o)
	if err != nil {
		return err
	}
	return s.Create(ctx, KeyOwner, data)
}

// WriteOwner replaces the owner record: a store taken over on purpose.
func (s *Store) WriteOwner(ctx context.Context, o spec.ClusterOwner) error {
	data, err := jsonLine(o)
	if err != nil {
		return err
	}
	return s.Write(ctx, KeyOwner, data)
}

func (s *Store) wrap(op, key string, err error) error {
	if errors.Is(err, ErrUnreachable) {
		return err
	}
	if errors.Is(err, ErrBadKey) {
		return fmt.Errorf("%w (%s in %s)", err, op, s.url)
	}
	if gcerrors.Code(err) == gcerrors.NotFound || errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s in %s", ErrNotFound, key, s.url)
	}
	return fmt.Errorf("%w: %s %s in %s: %s", ErrUnreachable, op, key, s.url, brief(err))
}

func jsonLine(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("store: encode: %w", err)
	}
	return buf.Bytes(), nil
}

// isTempName reports whether key is a file:// store's temporary file, left
// behind if a writer died: ours (".create-*") or fileblob's ("*.tmp").
func isTempName(key string) bool {
	base := filepath.Base(key)
	return strings.HasPrefix(base, ".create-") || strings.HasSuffix(base, ".tmp")
}
