package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// The ctl presents a client certificate to the agents' peer API (status)
// and to etcd. It uses --cacert, --cert and --key when given; otherwise
// it issues itself a short-lived one from the cluster's CA, read from
// --pki-dir or from the backup store: whoever may read the store's pki/
// prefix may act as a client of the cluster.

// ephemeralValidity is how long the ctl's own in-memory certificate lasts.
const ephemeralValidity = time.Hour

// clientTLS is the TLS the ctl talks to agents and etcd with.
func (o *options) clientTLS(ctx context.Context) (*tls.Config, error) {
	if o.cert != "" || o.key != "" || o.cacert != "" {
		if o.cert == "" || o.key == "" || o.cacert == "" {
			return nil, usagef("--cacert, --cert and --key go together")
		}
		return loadClientFiles(o.cacert, o.cert, o.key, time.Now())
	}
	st, err := o.loadTrust(ctx)
	if err != nil {
		return nil, err
	}
	ca := st.CA
	host, _ := os.Hostname()
	certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: "etcd-manager-ctl@" + host, Role: pki.RoleClient, Validity: ephemeralValidity}, nil, time.Now())
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	// While a CA rotation runs, nodes hold certificates from either CA.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(st.Trust)
	return pki.StaticClientConfig(pair, pool), nil
}

// loadClientFiles reads a client certificate and the CA to trust, and
// refuses, in words, a certificate that cannot work: expired, not yet
// valid, or not issued by that CA.
func loadClientFiles(caFile, certFile, keyFile string, now time.Time) (*tls.Config, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--cacert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--cacert %s holds no PEM certificate", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--cert/--key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("--cert: %w", err)
	}
	ca, err := pki.ParseCertPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("--cacert: %w", err)
	}
	if err := (&pki.CA{Cert: ca}).Verify(leaf, "", now); err != nil {
		return nil, fmt.Errorf("--cert %s cannot be used: %w", certFile, err)
	}
	return pki.StaticClientConfig(pair, pool), nil
}

// loadTrust reads the cluster's CA from --pki-dir or the backup store,
// and refuses one that is not valid now, with the CAs to trust: both of
// a rotation's while one runs.
func (o *options) loadTrust(ctx context.Context) (pki.StoreTrust, error) {
	if o.pkiDir != "" {
		ca, err := pki.LoadCADir(o.pkiDir, time.Now())
		if err != nil {
			return pki.StoreTrust{}, err
		}
		return pki.StoreTrust{CA: ca, Trust: ca.CertPEM}, nil
	}
	s, err := o.openStore(ctx, false)
	if err != nil {
		return pki.StoreTrust{}, err
	}
	defer s.Close()
	st, err := pki.LoadStoreTrust(ctx, s, isNotFound, time.Now())
	if errors.Is(err, pki.ErrBadRotation) && st.CA != nil {
		// The operator's tools keep working, on the CA alone.
		fprintf(o.stderr, "warning: %v; trusting the store's CA alone (see rotate-ca status)\n", err)
		return st, nil
	}
	if errors.Is(err, pki.ErrNoCA) {
		return st, fmt.Errorf("%w: the agents generate it when they first start with TLS; for agents started with --insecure, pass --insecure here too", err)
	}
	return st, err
}

// Validity of the certificates issue-client-cert writes. They cannot be
// revoked: nothing on the cluster records them, so they are kept short.
const (
	defaultClientCertValidity = 24 * time.Hour
	maxClientCertValidity     = 90 * 24 * time.Hour
)

func issueClientCertCommand(o *options, stdout io.Writer) *cobra.Command {
	var out, name string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "issue-client-cert --out DIR",
		Short: "Write a client certificate from the cluster's CA, for etcdctl and other etcd clients",
		Long: `issue-client-cert signs a client certificate with the cluster's CA (from
--pki-dir, or the backup store's pki/ prefix) and writes ca.crt, client.crt
and client.key to --out. etcd requires a client certificate from that CA, so
this is how an operator gets one for etcdctl. It is a client certificate
only: the agents let it read status and nothing more, and etcd's peer port
refuses it, as it requires a name that only node certificates carry (so
--name may not be one under etcd-manager.internal).

The certificate cannot be revoked, so keep --validity short: 24h by default,
at most 2160h (90 days). --out is created with mode 0700 when missing, and
refused when every user may write to it. Each file is written whole, through
a new file renamed into place, the key with mode 0600; a symbolic link in
place of a file is refused, not followed. It prints which CA signed (its
serial, SHA-256 fingerprint and expiry), to compare with the agents' CA.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test issue-client-cert --out ./certs
  etcdctl --endpoints=https://127.0.0.1:4001 --cacert=certs/ca.crt --cert=certs/client.crt --key=certs/client.key get / --prefix`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out DIR is required")
			}
			if err := checkClientCertValidity(validity); err != nil {
				return usageError{err}
			}
			if pki.IsReservedName(name) {
				return usagef("--name %q: names under %s are reserved for node certificates, which etcd's peer port accepts; choose another", name, pki.ReservedDomain)
			}
			files := []clientFile{
				{filepath.Join(out, "client.key"), nil, 0o600},
				{filepath.Join(out, "client.crt"), nil, 0o644},
				{filepath.Join(out, "ca.crt"), nil, 0o644},
			}
			if err := prepareOutDir(out, files); err != nil {
				return err
			}
			st, err := o.loadTrust(cmd.Context())
			if err != nil {
				return err
			}
			ca := st.CA
			certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: name, Role: pki.RoleClient, Validity: validity}, nil, time.Now())
			if err != nil {
				return err
			}
			files[0].data, files[1].data, files[2].data = keyPEM, certPEM, st.Trust
			if err := os.MkdirAll(out, 0o700); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			for _, f := range files {
				if err := pki.WriteFileAtomic(f.path, f.data, f.mode); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			c, err := pki.ParseCertPEM(certPEM)
			if err != nil {
				return err
			}
			if o.structured() {
				res := clientCertResult{CACert: files[2].path, Cert: files[1].path, Key: files[0].path, CommonName: name,
					Expires: c.NotAfter.UTC(), CA: *caOf(ca.Cert)}
				if r := st.Rotation; r != nil && r.Phase != pki.PhaseDropOld {
					res.RotationPhase, res.FromOldCA = r.Phase, ca.Cert.Equal(r.Old())
				}
				return o.emit(stdout, res, nil)
			}
			_, err = fmt.Fprintf(stdout, "wrote %s, %s and %s (client %q, expires %s)\n"+
				"issued by CA %q, serial %s, SHA-256 fingerprint %s, expires %s\n",
				files[2].path, files[1].path, files[0].path, name, c.NotAfter.UTC().Format(time.RFC3339),
				ca.Cert.Subject.CommonName, pki.Serial(ca.Cert), pki.Fingerprint(ca.Cert), ca.Cert.NotAfter.UTC().Format(time.RFC3339))
			if r := st.Rotation; err == nil && r != nil && r.Phase != pki.PhaseDropOld {
				fprintf(stdout, "a CA rotation is at phase %s: ca.crt holds both its CAs, the old %s and the new %s\n",
					r.Phase, pki.Describe(r.Old()), pki.Describe(r.New()))
				if ca.Cert.Equal(r.Old()) {
					fprintf(stdout, "this certificate is from the old CA, which the cluster stops trusting at rotate-ca finish: issue another after rotate-ca continue\n")
				}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write ca.crt, client.crt and client.key to; created with mode 0700 when missing")
	cmd.Flags().StringVar(&name, "name", "etcd-manager-client", "the certificate's common name, which etcd logs for the client")
	cmd.Flags().DurationVar(&validity, "validity", defaultClientCertValidity,
		fmt.Sprintf("how long the certificate is valid, at most %s (90 days): it cannot be revoked, so keep it short", maxClientCertValidity))
	return cmd
}

// clientCertResult is what issue-client-cert reports.
type clientCertResult struct {
	CACert     string    `json:"caCert"`
	Cert       string    `json:"cert"`
	Key        string    `json:"key"`
	CommonName string    `json:"commonName"`
	Expires    time.Time `json:"expires"`
	CA         caResult  `json:"ca"`
	// RotationPhase is the CA rotation's phase while one is in progress:
	// ca.crt holds both CAs then.
	RotationPhase string `json:"rotationPhase,omitempty"`
	// FromOldCA is set when the old CA of a rotation issued the
	// certificate, which the cluster stops trusting at rotate-ca finish.
	FromOldCA bool `json:"fromOldCA,omitempty"`
}

// clientFile is one file issue-client-cert writes.
type clientFile struct {
	path string
	data []byte
	mode os.FileMode
}

// checkClientCertValidity refuses a --validity that is not positive or
// over the maximum.
func checkClientCertValidity(v time.Duration) error {
	switch {
	case v <= 0:
		return fmt.Errorf("--validity %s must be positive, such as %s", v, defaultClientCertValidity)
	case v > maxClientCertValidity:
		return fmt.Errorf("--validity %s is over the maximum of %s (90 days): a client certificate cannot be revoked, so issue a new one when it expires", v, maxClientCertValidity)
	}
	return nil
}

// ownerOf is the user ID owning a file, or -1 when it is unknown.
func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// prepareOutDir checks --out before anything is issued: it must be a
// directory that not every user may write to (they could replace the key
// once written), and none of the files may be a symbolic link or other
// non-regular file, so that none is written unless all can be. A missing
// folder is fine: it is created with mode 0700. --out itself may be a
// link: the operator named it.
func prepareOutDir(dir string, files []clientFile) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--out: %w", err)
	case !st.IsDir():
		return fmt.Errorf("--out %s is not a directory", dir)
	case st.Mode().Perm()&0o002 != 0:
		return fmt.Errorf("--out %s may be written by every user, who could replace the key once written; use a folder only you can write to (a new one is created with mode 0700)", dir)
	case ownerOf(st) != os.Geteuid():
		return fmt.Errorf("--out %s belongs to user %d, not to you (%d): its owner could replace the key or the CA once written; use a folder of your own (a new one is created with mode 0700)", dir, ownerOf(st), os.Geteuid())
	}
	for _, f := range files {
		st, err := os.Lstat(f.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("--out: %w", err)
		case st.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("--out: %w: %s; remove the link, or use another --out", pki.ErrSymlink, f.path)
		case !st.Mode().IsRegular():
			return fmt.Errorf("--out: %s is not a regular file; remove it, or use another --out", f.path)
		}
	}
	return nil
}
