package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The leader's side of a CA rotation (see plan.planCARotation): it reads
// the store's rotation record each cycle, has nodes take up the store's
// CA, and records the phases the nodes have reached.

// observeCARotation reads the store's CA rotation, nil when none runs.
// It reads the issuing CA only while a rotation runs.
func (lp *loop) observeCARotation(ctx context.Context, s *store.Store) (*plan.CARotation, error) {
	r, err := pki.LoadRotation(ctx, s, isNotFound)
	if err != nil || r == nil {
		return nil, err
	}
	st, err := pki.LoadStoreTrust(ctx, s, isNotFound, lp.now())
	if err != nil {
		return nil, err
	}
	if st.Rotation == nil {
		return nil, nil // ended meanwhile
	}
	roll, next, gate := st.Rotation.Step()
	return &plan.CARotation{Phase: st.Rotation.Phase, Trust: pki.Fingerprints(st.Trust), Issuer: pki.Fingerprint(st.CA.Cert),
		RollEtcd: roll, Next: next, Gate: gate}, nil
}

// advanceCARotation records the rotation's next phase, or ends it: the
// record and the new CA's spare copy are removed (pki/ca.key holds it).
// The record must still be at the phase the plan saw.
func (lp *loop) advanceCARotation(ctx context.Context, act plan.AdvanceCARotation) error {
	if _, err := lp.members.Leader(ctx); err != nil {
		return err
	}
	s, err := lp.openStore(ctx)
	if err != nil {
		return err
	}
	r, err := pki.LoadRotation(ctx, s, isNotFound)
	if err != nil {
		return err
	}
	if r == nil || r.Phase != act.From {
		return fmt.Errorf("controller: the CA rotation record changed meanwhile: %w", procedure.ErrWait)
	}
	if act.To == "" {
		// The copy for whoever only trusts the cluster drops the old CA
		// first; the record goes last, so a crash before it ends here
		// again.
		if err := s.Write(ctx, pki.StoreCACert, r.Trust()); err != nil {
			return fmt.Errorf("controller: write %s: %w", pki.StoreCACert, err)
		}
		if err := s.Delete(ctx, pki.StoreNextCAKey); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("controller: delete %s: %w", pki.StoreNextCAKey, err)
		}
		if err := s.Delete(ctx, pki.StoreRotation); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("controller: delete %s: %w", pki.StoreRotation, err)
		}
		lp.log.Warn("CA rotation done: every node trusts the new CA alone", "ca", pki.ShortName(r.New()),
			"started", r.Started, "old-ca", pki.ShortName(r.Old()))
		return nil
	}
	r.Phase, r.Updated = act.To, lp.now().UTC()
	if err := s.Write(ctx, pki.StoreRotation, r.Encode()); err != nil {
		return fmt.Errorf("controller: record phase %s in %s: %w", act.To, pki.StoreRotation, err)
	}
	lp.log.Warn("CA rotation phase done", "from", act.From, "to", act.To)
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
