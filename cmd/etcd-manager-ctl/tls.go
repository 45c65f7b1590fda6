package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
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
	ca, err := o.loadCA(ctx)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: "etcd-manager-ctl@" + host, Role: pki.RoleClient, Validity: ephemeralValidity}, nil, time.Now())
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return pki.StaticClientConfig(pair, ca.Pool()), nil
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

// loadCA reads the cluster's CA from --pki-dir or the backup store.
func (o *options) loadCA(ctx context.Context) (*pki.CA, error) {
	if o.pkiDir != "" {
		return pki.LoadCADir(o.pkiDir)
	}
	s, err := o.openStore(ctx, false)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ca, err := pki.LoadStoreCA(ctx, s, func(err error) bool { return errors.Is(err, store.ErrNotFound) })
	if errors.Is(err, pki.ErrNoCA) {
		return nil, fmt.Errorf("%w: the agents generate it when they first start with TLS; for agents started with --insecure, pass --insecure here too", err)
	}
	return ca, err
}

func issueClientCertCommand(o *options, stdout io.Writer) *cobra.Command {
	var out, name string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "issue-client-cert --out DIR",
		Short: "Write a client certificate from the cluster's CA, for etcdctl and other etcd clients",
		Long: `issue-client-cert signs a client certificate with the cluster's CA (from
--pki-dir, or the backup store's pki/ prefix) and writes ca.crt, client.crt
and client.key (mode 0600) to --out. etcd requires a client certificate
from that CA, so this is how an operator gets one for etcdctl.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test issue-client-cert --out ./certs
  etcdctl --endpoints=https://127.0.0.1:4001 --cacert=certs/ca.crt --cert=certs/client.crt --key=certs/client.key get / --prefix`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out DIR is required")
			}
			ca, err := o.loadCA(cmd.Context())
			if err != nil {
				return err
			}
			certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: name, Role: pki.RoleClient, Validity: validity}, nil, time.Now())
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			for _, f := range []struct {
				name string
				data []byte
				mode os.FileMode
			}{{"ca.crt", ca.CertPEM, 0o644}, {"client.crt", certPEM, 0o644}, {"client.key", keyPEM, 0o600}} {
				if err := os.WriteFile(filepath.Join(out, f.name), f.data, f.mode); err != nil {
					return err
				}
			}
			c, _ := pki.ParseCertPEM(certPEM)
			_, err = fmt.Fprintf(stdout, "wrote %s, %s and %s (client %q, expires %s)\n",
				filepath.Join(out, "ca.crt"), filepath.Join(out, "client.crt"), filepath.Join(out, "client.key"),
				name, c.NotAfter.UTC().Format(time.RFC3339))
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write ca.crt, client.crt and client.key to")
	cmd.Flags().StringVar(&name, "name", "etcd-manager-client", "the certificate's common name, which etcd logs for the client")
	cmd.Flags().DurationVar(&validity, "validity", 30*24*time.Hour, "how long the certificate is valid")
	return cmd
}
