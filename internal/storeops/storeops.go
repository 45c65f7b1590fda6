package storeops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Errors. Check them with errors.Is.
var (
	// ErrStoreInUse means the store's owner record names another object:
	// the store holds another cluster.
	ErrStoreInUse = errors.New("storeops: the store belongs to another cluster")
	// ErrRefused means a request that trying again cannot help: a spec
	// that is invalid, a backup that cannot be restored.
	ErrRefused = errors.New("storeops: refused")
)

// CommandRows lists the store's command queue as list-commands shows it.
func CommandRows(ctx context.Context, s *store.Store) ([]cli.CommandRow, error) {
	cmds, err := s.ListCommands(ctx)
	if err != nil {
		return nil, err
	}
	rows := []cli.CommandRow{}
	for _, q := range cmds {
		rows = append(rows, CommandRow(q))
	}
	return rows, nil
}

// CommandRow is one queued command as list-commands shows it.
func CommandRow(q store.QueuedCommand) cli.CommandRow {
	r := cli.CommandRow{ID: q.ID, Kind: q.Command.Kind(), State: q.Status.State, Detail: q.Status.Message, Queued: stamp(q.Command.Timestamp), Updated: stamp(q.Status.Updated), Expires: stamp(q.Command.Expires)}
	switch {
	case q.Newer != nil:
		// Written by a newer etcd-manager: say so, and trust nothing else.
		r.Detail = q.Newer.Error()
	case q.Err != nil && q.Status.State != spec.CommandFailed:
		// Junk not yet seen by a leader: show why it will fail.
		r.Detail = q.Err.Error()
	case q.Command.RestoreBackup != nil:
		r.Backup = q.Command.RestoreBackup.Backup
		if q.Status.Restore != nil {
			r.Phase, r.Check = q.Status.Restore.Phase, q.Status.Restore.Check
		}
	case q.Command.DumpRestore != nil:
		if p := q.Status.Restore; p != nil {
			r.Backup, r.Phase = p.Backup, p.Phase
		}
	case q.Status.Backup != "":
		r.Backup = q.Status.Backup
	}
	return r
}

func stamp(ns spec.Int64) string {
	if ns == 0 {
		return ""
	}
	return time.Unix(0, int64(ns)).UTC().Format(time.RFC3339)
}

// BackupRows lists the store's complete backups, oldest first, as
// list-backups shows them, with their ages at now.
func BackupRows(ctx context.Context, s *store.Store, now time.Time) ([]cli.BackupRow, error) {
	infos, err := backup.List(ctx, s)
	if err != nil {
		return nil, err
	}
	rows := []cli.BackupRow{}
	for _, i := range infos {
		row := cli.BackupRow{Name: i.Name, EtcdVersion: i.Meta.EtcdVersion, Size: i.Meta.Size, CompressedSize: i.Meta.CompressedSize,
			Revision: i.Meta.Revision, AgeSeconds: now.Sub(time.Unix(int64(i.Meta.Timestamp), 0)).Seconds(), Kind: i.Meta.Kind}
		if e := i.Meta.Encryption; e != nil {
			row.EncryptionKeyID = e.KeyID
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// CheckBackup refuses, before anything is queued, a backup that cannot be
// restored: one that is not there, whose meta is damaged, or that is not
// whole (a meta without its data, or data without its meta, as while it
// is written). The leader checks it again, and verifies what it holds,
// before it stops anything. A refusal wraps ErrRefused.
func CheckBackup(ctx context.Context, s *store.Store, name string) error {
	_, err := backup.ReadMeta(ctx, s, name)
	switch {
	case errors.Is(err, backup.ErrNotFound):
		// Objects without a meta are a backup being written, or one cut
		// short. A name that is no path element lists nothing.
		if name != "" && !strings.ContainsAny(name, "/\\") && !strings.HasPrefix(name, ".") {
			if objs, lerr := s.List(ctx, name+"/", ""); lerr == nil && len(objs) > 0 {
				return fmt.Errorf("%w: backup %s in %s is not whole: it has no %s (it is being written, or was cut short); list-backups prints the complete backups", ErrRefused, name, s.URL(), backup.MetaObject)
			}
		}
		return fmt.Errorf("%w: no backup %q in %s; list-backups prints the backups a restore can use", ErrRefused, name, s.URL())
	case errors.Is(err, backup.ErrCorrupt) || errors.Is(err, backup.ErrCheckLimit):
		return fmt.Errorf("%w: backup %s cannot be restored: %w", ErrRefused, name, err)
	case err != nil:
		return err
	}
	if _, err := s.ModTime(ctx, name+"/"+backup.DataObject); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: backup %s in %s is not whole: it has no %s; list-backups prints the complete backups", ErrRefused, name, s.URL(), backup.DataObject)
	} else if err != nil {
		return err
	}
	return nil
}

// QueueRestore queues a restore of the named backup (to its own revision)
// once CheckBackup passes, with the store's spec as the spec to restore
// as, and returns the command's ID.
func QueueRestore(ctx context.Context, s *store.Store, name string, now time.Time) (string, error) {
	if err := CheckBackup(ctx, s, name); err != nil {
		return "", err
	}
	cmd := spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: name}}
	// The format carries the spec to restore as; ours is the store's.
	if cs, err := s.ReadSpec(ctx); err == nil {
		cmd.RestoreBackup.ClusterSpec = &cs
	}
	return s.AddCommand(ctx, cmd, now)
}

// Claim says how a spec's writer may take a store.
type Claim struct {
	// TakeOver lets the writer replace another owner's record: a store
	// taken over on purpose, such as one kept by a deleted cluster that
	// a restore into a new cluster reads.
	TakeOver bool
	// Unowned lets the writer own a store that holds a spec but no owner
	// record: one written by etcd-manager-ctl, or by an operator older
	// than the record, for the cluster the writer has shown is its own.
	Unowned bool
}

// WriteOwnedSpec writes cs as the store's spec on behalf of owner: the
// owner record is created first if there is none, and a store another
// object owns, or that holds a spec and no owner, refuses the write with
// ErrStoreInUse unless the claim allows it. An invalid spec is refused
// with ErrRefused. A refused write leaves the store as it was.
func WriteOwnedSpec(ctx context.Context, s *store.Store, cs spec.ClusterSpec, owner spec.ClusterOwner, c Claim) error {
	if err := owner.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if _, err := cs.Validate(); err != nil {
		return fmt.Errorf("%w: the cluster spec: %w", ErrRefused, err)
	}
	if err := claim(ctx, s, owner, c); err != nil {
		return err
	}
	return s.WriteSpec(ctx, cs)
}

// claim makes owner the store's owner, or checks that it is.
func claim(ctx context.Context, s *store.Store, owner spec.ClusterOwner, c Claim) error {
	have, err := s.ReadOwner(ctx)
	switch {
	case err == nil && have.Same(owner):
		if have.UID == owner.UID {
			return nil
		}
		// Made again under its name: the same cluster, a new object.
		return s.WriteOwner(ctx, owner)
	case err == nil && !c.TakeOver:
		return fmt.Errorf("%w: %s holds the spec of %s, not of %s", ErrStoreInUse, s.URL(), have, owner)
	case err == nil:
		return s.WriteOwner(ctx, owner)
	case errors.Is(err, store.ErrUnreachable):
		return err
	case !errors.Is(err, store.ErrNotFound) && !c.TakeOver:
		return fmt.Errorf("%w: its owner record is unreadable: %w", ErrStoreInUse, err)
	case !errors.Is(err, store.ErrNotFound):
		// An unreadable record, replaced on purpose.
		return s.WriteOwner(ctx, owner)
	}
	if !c.TakeOver && !c.Unowned {
		switch _, err := s.ReadSpec(ctx); {
		case err == nil:
			return fmt.Errorf("%w: %s holds a cluster spec with no owner record (written by etcd-manager-ctl, or by another operator)", ErrStoreInUse, s.URL())
		case !errors.Is(err, store.ErrNotFound) && errors.Is(err, store.ErrUnreachable):
			return err
		}
	}
	if err := s.CreateOwner(ctx, owner); errors.Is(err, store.ErrExists) {
		// Another writer won the race: see who.
		return claim(ctx, s, owner, Claim{})
	} else if err != nil {
		return err
	}
	return nil
}
