package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// rotate-ca replaces the CA kept in the backup store, live. The ctl
// writes the rotation record and opens its gates; the leader agent does
// the rest (see package pki for the phases).

// caRotationPoll is how often --wait reads the rotation record.
var caRotationPoll = 2 * time.Second

func rotateCACommand(o *options, stdout io.Writer) *cobra.Command {
	var wait bool
	var timeout, validity time.Duration
	root := &cobra.Command{
		Use:   "rotate-ca",
		Short: "Replace the cluster's CA while the cluster serves: start, continue, finish, status",
		Long: `rotate-ca replaces the CA kept in the backup store's pki/ prefix with a new
one, with no downtime and no failed writes, in three steps that each need
you, because only you can update the cluster's other clients:

  1. rotate-ca start: a new CA is generated, and every agent comes to
     trust both CAs; members restart etcd one at a time, followers first,
     as etcd reads the CAs it trusts only when it starts. The phase
     becomes "trusted" when all have.
     Then give every etcd client the new ca.crt, which holds both CAs
     (issue-client-cert writes it), so that they trust the nodes' new
     certificates of step 2.
  2. rotate-ca continue: the new CA issues from now on. Every node gets a
     new key and a certificate from the new CA, which etcd takes up
     without a restart. The phase becomes "reissued" when all have.
     Then switch every client to a certificate from the new CA
     (issue-client-cert, again).
  3. rotate-ca finish: every node comes to trust the new CA alone;
     members restart etcd one at a time. Certificates from the old CA are
     refused from then on. The rotation ends when all have.

The leader agent carries each step out and records its progress in the
store, so a rotation goes on after any agent restarts or the leadership
moves; every member's agent must be reachable for it to advance. With
--wait (the default) each command waits, printing the phases, until its
step is done. "status" (here, and the ctl's status command) shows each
node's CA. Agents that take their CA from --pki-dir cannot be rotated
this way: replace the files on every node instead.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test rotate-ca start
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test issue-client-cert --out ./certs
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test rotate-ca continue
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test issue-client-cert --out ./certs
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test rotate-ca finish`,
	}
	addWait := func(c *cobra.Command) *cobra.Command {
		c.Flags().BoolVar(&wait, "wait", true, "wait until the agents have done the step, printing the phases")
		c.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "how long --wait waits; the agents go on after it")
		c.Args = cobra.NoArgs
		return c
	}
	start := addWait(&cobra.Command{
		Use:   "start",
		Short: "Generate a new CA and have every node trust both CAs",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if validity <= 0 {
				return usagef("--validity %s must be positive", validity)
			}
			return o.rotateCA(cmd.Context(), stdout, "start", validity, wait, timeout)
		},
	})
	start.Flags().DurationVar(&validity, "validity", pki.DefaultCAValidity, "how long the new CA is valid")
	cont := addWait(&cobra.Command{
		Use:   "continue",
		Short: "Have the new CA issue, and every node take a new key and certificate from it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.rotateCA(cmd.Context(), stdout, "continue", 0, wait, timeout)
		},
	})
	finish := addWait(&cobra.Command{
		Use:   "finish",
		Short: "Have every node trust the new CA alone, and end the rotation",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.rotateCA(cmd.Context(), stdout, "finish", 0, wait, timeout)
		},
	})
	status := &cobra.Command{
		Use:   "status",
		Short: "Print the rotation's phase and what comes next",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := o.openCAStore(cmd.Context())
			if err != nil {
				return err
			}
			defer s.Close()
			r, err := pki.LoadRotation(cmd.Context(), s, isNotFound)
			if err != nil {
				return err
			}
			return o.emitRotation(stdout, r)
		},
	}
	root.AddCommand(start, cont, finish, status)
	return root
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// openCAStore opens the store for a rotation, which goes through the
// store's CA alone.
func (o *options) openCAStore(ctx context.Context) (*store.Store, error) {
	if o.pkiDir != "" {
		return nil, usagef("--pki-dir: rotate-ca rotates the CA kept in the backup store; a CA given as files is rotated by replacing them on every node")
	}
	if o.insecure {
		return nil, usagef("--insecure: rotate-ca rotates the CA of agents that use TLS")
	}
	return o.openStore(ctx, false)
}

// rotateCA takes one of the operator's steps of a rotation and, with
// wait, waits for the agents to carry it out.
func (o *options) rotateCA(ctx context.Context, w io.Writer, step string, validity time.Duration, wait bool, timeout time.Duration) error {
	s, err := o.openCAStore(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	out := w
	w = o.progressTo(out)
	now := time.Now()
	r, err := pki.LoadRotation(ctx, s, isNotFound)
	if err != nil {
		return err
	}
	var until string // the phase that ends the wait; "" the rotation's end
	switch step {
	case "start":
		if r != nil {
			return fmt.Errorf("a CA rotation is in progress already, at phase %s (started %s): see rotate-ca status", r.Phase, r.Started.Format(time.RFC3339))
		}
		if r, err = startRotation(ctx, s, validity, now); err != nil {
			return err
		}
		fprintf(w, "started rotating the CA: from %s to %s (expires %s)\n", pki.Describe(r.Old()), pki.Describe(r.New()), r.New().NotAfter.UTC().Format(time.RFC3339))
		until = pki.PhaseTrusted
	case "continue":
		if err := gate(r, pki.PhaseTrusted, "start"); err != nil {
			return err
		}
		if r.Phase == pki.PhaseTrusted {
			if err := continueRotation(ctx, s, r, now); err != nil {
				return err
			}
			fprintf(w, "the new CA %s issues now; every node gets a new key and a certificate from it\n", pki.Describe(r.New()))
		}
		until = pki.PhaseReissued
	case "finish":
		if err := gate(r, pki.PhaseReissued, "continue"); err != nil {
			return err
		}
		if r.Phase == pki.PhaseReissued {
			r.Phase, r.Updated = pki.PhaseDropOld, now.UTC()
			if err := s.Write(ctx, pki.StoreRotation, r.Encode()); err != nil {
				return fmt.Errorf("record phase %s in %s: %w", r.Phase, pki.StoreRotation, err)
			}
			fprintf(w, "every node is to trust the new CA alone; certificates from the old CA %s are refused once each member restarts\n", pki.Describe(r.Old()))
		}
	}
	if !wait {
		return o.emitRotation(out, r)
	}
	r, err = waitRotation(ctx, w, s, until, timeout)
	if err != nil {
		return err
	}
	return o.emitRotation(out, r)
}

// gate checks that a rotation stands at phase want, or past it (the
// step was taken already, and is waited for again); before it, the error
// says what to wait for.
func gate(r *pki.Rotation, want, earlier string) error {
	if r == nil {
		return errors.New("no CA rotation is in progress: rotate-ca start begins one")
	}
	if pki.PhaseIndex(r.Phase) < pki.PhaseIndex(want) {
		return fmt.Errorf("the CA rotation is at phase %s: the agents have not finished rotate-ca %s yet (see rotate-ca status, or run rotate-ca %s --wait)",
			r.Phase, earlier, earlier)
	}
	return nil
}

// startRotation generates the new CA, keeps it under StoreNextCAKey (or
// takes the one a start that was interrupted left there), and creates the
// rotation record.
func startRotation(ctx context.Context, s *store.Store, validity time.Duration, now time.Time) (*pki.Rotation, error) {
	old, err := pki.LoadStoreCA(ctx, s, isNotFound, now)
	if errors.Is(err, pki.ErrNoCA) {
		return nil, fmt.Errorf("%w: the agents generate it when they first start with TLS; there is nothing to rotate yet", err)
	}
	if err != nil {
		return nil, err
	}
	next, err := loadNextCA(ctx, s, now)
	if err != nil {
		return nil, err
	}
	if next == nil || next.Cert.Equal(old.Cert) {
		// Named by its date, to tell the two apart; backdated an hour,
		// for agents whose clocks are behind this machine's.
		if next, err = pki.GenerateNamedCA(now, validity, "etcd-manager CA "+now.UTC().Format(time.DateOnly), time.Hour); err != nil {
			return nil, err
		}
		kp, err := next.KeyPEM()
		if err != nil {
			return nil, err
		}
		if err := s.Write(ctx, pki.StoreNextCAKey, append(kp, next.CertPEM...)); err != nil {
			return nil, fmt.Errorf("store the new CA in %s: %w", pki.StoreNextCAKey, err)
		}
	}
	r := pki.NewRotation(old.Cert, next.Cert, now)
	if err := s.Create(ctx, pki.StoreRotation, r.Encode()); err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, errors.New("a CA rotation was started meanwhile by someone else: see rotate-ca status")
		}
		return nil, fmt.Errorf("create %s: %w", pki.StoreRotation, err)
	}
	// The copy for whoever only trusts the cluster holds both CAs from
	// now until the rotation ends.
	if err := s.Write(ctx, pki.StoreCACert, r.Trust()); err != nil {
		return nil, fmt.Errorf("write %s: %w", pki.StoreCACert, err)
	}
	return r, nil
}

// loadNextCA reads the new CA a rotation keeps aside, nil when there is
// none.
func loadNextCA(ctx context.Context, s *store.Store, now time.Time) (*pki.CA, error) {
	data, err := s.ReadMax(ctx, pki.StoreNextCAKey, pki.MaxStoreCASize)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ca, err := pki.ParseCA(data, data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, pki.StoreNextCAKey)
	}
	if err := ca.ValidAt(now); err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, pki.StoreNextCAKey)
	}
	return ca, nil
}

// continueRotation makes the new CA the one that issues, then records
// the phase. Taken again after a crash, it writes the same.
func continueRotation(ctx context.Context, s *store.Store, r *pki.Rotation, now time.Time) error {
	cur, err := pki.LoadStoreCA(ctx, s, isNotFound, now)
	if err != nil {
		return err
	}
	if !cur.Cert.Equal(r.New()) {
		next, err := loadNextCA(ctx, s, now)
		if err != nil {
			return err
		}
		if next == nil || !next.Cert.Equal(r.New()) {
			return fmt.Errorf("the new CA's key is missing from %s, or is not the rotation's %s; start over: delete %s and %s, and run rotate-ca start",
				pki.StoreNextCAKey, pki.Describe(r.New()), pki.StoreRotation, pki.StoreNextCAKey)
		}
		kp, err := next.KeyPEM()
		if err != nil {
			return err
		}
		if err := s.Write(ctx, pki.StoreCAKey, append(kp, next.CertPEM...)); err != nil {
			return fmt.Errorf("write the new CA to %s: %w", pki.StoreCAKey, err)
		}
	}
	// Written again whatever an earlier run left: both CAs, until the end.
	if err := s.Write(ctx, pki.StoreCACert, r.Trust()); err != nil {
		return fmt.Errorf("write %s: %w", pki.StoreCACert, err)
	}
	r.Phase, r.Updated = pki.PhaseReissue, now.UTC()
	if err := s.Write(ctx, pki.StoreRotation, r.Encode()); err != nil {
		return fmt.Errorf("record phase %s in %s: %w", r.Phase, pki.StoreRotation, err)
	}
	return nil
}

// waitRotation prints each phase the rotation reaches until it reaches
// until, or ends when until is empty, and returns the rotation then (nil
// once it ended).
func waitRotation(ctx context.Context, w io.Writer, s *store.Store, until string, timeout time.Duration) (*pki.Rotation, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		r, err := pki.LoadRotation(ctx, s, isNotFound)
		switch {
		case err != nil && ctx.Err() == nil:
			fprintf(w, "cannot read the rotation record (retrying): %v\n", err)
		case err == nil && r == nil:
			if until != "" {
				return nil, errors.New("the CA rotation record is gone: someone ended the rotation meanwhile")
			}
			fprintf(w, "CA rotation done: every node trusts the new CA alone\n")
			return nil, nil
		case err == nil:
			if r.Phase != last {
				fprintf(w, "%s phase %s\n", time.Now().UTC().Format(time.TimeOnly), r.Phase)
				last = r.Phase
			}
			if until != "" && pki.PhaseIndex(r.Phase) >= pki.PhaseIndex(until) {
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, stillQueued{fmt.Errorf("the CA rotation is still at phase %s after %s; the agents go on (see rotate-ca status, and status for each node's CA and the leader's warnings)", last, timeout)}
		case <-time.After(caRotationPoll):
		}
	}
}

// rotationResult is where a rotation stands, as rotate-ca reports it.
type rotationResult struct {
	// InProgress is false when no rotation is in progress (or the one
	// waited for ended).
	InProgress bool       `json:"inProgress"`
	Phase      string     `json:"phase,omitempty"`
	Started    *time.Time `json:"started,omitempty"`
	Updated    *time.Time `json:"updated,omitempty"`
	OldCA      *caResult  `json:"oldCA,omitempty"`
	NewCA      *caResult  `json:"newCA,omitempty"`
	Next       string     `json:"next,omitempty"`
}

// caResult names a CA certificate.
type caResult struct {
	Subject string    `json:"subject"`
	Serial  string    `json:"serial"`
	SHA256  string    `json:"sha256"`
	Expires time.Time `json:"expires"`
}

func caOf(c *x509.Certificate) *caResult {
	return &caResult{Subject: c.Subject.CommonName, Serial: pki.Serial(c), SHA256: pki.Fingerprint(c), Expires: c.NotAfter.UTC()}
}

// emitRotation reports where rotation r stands (nil: none in progress).
func (o *options) emitRotation(w io.Writer, r *pki.Rotation) error {
	res := rotationResult{}
	if r != nil {
		res = rotationResult{InProgress: true, Phase: r.Phase, Started: &r.Started, Updated: &r.Updated,
			OldCA: caOf(r.Old()), NewCA: caOf(r.New()), Next: rotationNext(r.Phase)}
	}
	return o.emit(w, res, func() error { printRotation(w, r); return nil })
}

// printRotation says where a rotation stands and what to do next.
func printRotation(w io.Writer, r *pki.Rotation) {
	if r == nil {
		fprintf(w, "no CA rotation is in progress\n")
		return
	}
	fprintf(w, "phase:   %s (started %s, last change %s)\nold CA:  %s, SHA-256 %s\nnew CA:  %s, SHA-256 %s\nnext:    %s\n",
		r.Phase, r.Started.Format(time.RFC3339), r.Updated.Format(time.RFC3339),
		pki.Describe(r.Old()), pki.Fingerprint(r.Old()), pki.Describe(r.New()), pki.Fingerprint(r.New()), rotationNext(r.Phase))
}

func rotationNext(phase string) string {
	switch phase {
	case pki.PhaseTrustBoth:
		return "the agents are making every node trust both CAs (members restart etcd one at a time)"
	case pki.PhaseTrusted:
		return "give every etcd client the ca.crt that holds both CAs (issue-client-cert writes it), then run rotate-ca continue"
	case pki.PhaseReissue:
		return "the agents are giving every node a new key and a certificate from the new CA"
	case pki.PhaseReissued:
		return "switch every etcd client to a certificate from the new CA (issue-client-cert), then run rotate-ca finish"
	}
	return "the agents are making every node trust the new CA alone (members restart etcd one at a time)"
}
