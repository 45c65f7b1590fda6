package status

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Figures are the backup store's figures, read alike by every agent so
// that a change of leader resets nothing: the newest backup of each kind
// (its duration and size), the last failed backup, and the restore
// drills' record. They are shown as gauges, which a backup this agent
// takes or fails updates at once. Create them with NewFigures; they
// belong to the loop's goroutine but for Taken and Failed.
type Figures struct {
	met figureMetrics
	now func() time.Time
	// metaCache holds the newest backups' metas as last read (nil: no
	// valid meta, for good).
	metaCache map[string]*backup.Meta
	// futureSaid names the backups dated in the future last logged.
	futureSaid string
}

// NewFigures returns the figures, their gauges registered with reg.
func NewFigures(reg prometheus.Registerer, now func() time.Time) *Figures {
	return &Figures{met: newFigureMetrics(reg), now: now}
}

// StoreFigures are what one read of the store found.
type StoreFigures struct {
	// Newest is the newest backup with a valid meta, nil for none.
	Newest *backup.Info
	// Drillable is the newest of them that the timeline Read was given
	// took: what a restore drill restores. nil for none.
	Drillable *backup.Info
	// Future names the backups left out for being dated after this
	// agent's clock and spec.FutureSkew, the first maxFutureNames of
	// them.
	Future []string
	// Drills is the restore drills' record, nil before any; DrillsErr
	// why it could not be read.
	Drills    *spec.DrillRecord
	DrillsErr error
}

// maxFutureNames bounds StoreFigures.Future: names can be planted
// without end.
const maxFutureNames = 5

func (f *StoreFigures) future(name string) {
	if len(f.Future) < maxFutureNames {
		f.Future = append(f.Future, name)
	}
}

// FiguresStore is the part of the store the figures read.
type FiguresStore interface {
	backup.Store
	backup.Reader
	ReadBackupFailure(ctx context.Context) (*spec.BackupFailure, error)
	ReadDrills(ctx context.Context) (*spec.DrillRecord, error)
}

// Read reads the figures from the store and shows them; timeline is the
// cluster token whose newest backup is Drillable. It fails only when the
// newest backups cannot be listed; the records that cannot be read are
// logged. Backups dated in the future are left out, and logged.
func (f *Figures) Read(ctx context.Context, s FiguresStore, log *slog.Logger, timeline string) (StoreFigures, error) {
	out, err := f.newestOfEachKind(ctx, s, timeline)
	if err != nil {
		return out, fmt.Errorf("status: the newest backups: %w", err)
	}
	newest := out.Newest
	// Said once while the same backups are left out.
	if said := strings.Join(out.Future, " "); said != f.futureSaid {
		f.futureSaid = said
		if said != "" {
			log.Warn("backups dated after this agent's clock are left out of the newest backups and the restore drills", "backups", out.Future, "allowed-skew", spec.FutureSkew)
		}
	}
	fl, err := s.ReadBackupFailure(ctx)
	switch {
	case err != nil:
		log.Warn("cannot read the last failed backup for the metrics", "error", err)
	case fl != nil:
		f.met.backupLastFailure.Set(float64(fl.Time.Unix()))
	}
	out.Drills, out.DrillsErr = s.ReadDrills(ctx)
	switch {
	case out.DrillsErr != nil:
		log.Warn("cannot read the restore drills' record", "error", out.DrillsErr)
	case out.Drills != nil:
		f.met.drillFigures(out.Drills)
	}
	if newest != nil {
		f.met.backupLastOK.Set(float64(int64(newest.Meta.Timestamp)))
	}
	return out, nil
}

// Taken shows a backup this agent took, which finished at.
func (f *Figures) Taken(info backup.Info, at time.Time) {
	f.met.backupLastOK.Set(float64(at.Unix()))
	f.met.backupFigures(info.Meta)
}

// Failed shows a backup this agent failed at.
func (f *Figures) Failed(at time.Time) {
	f.met.backupFailures.Inc()
	f.met.backupLastFailure.Set(float64(at.Unix()))
}

// Bounds of newestOfEachKind: the newest names it looks at, and the metas it
// reads at most in one pass (a meta, once written, never changes, so the
// ones read are kept).
const (
	figuresNames     = 50
	figuresMetaReads = 10
	// figuresUnfinished is the age past which a backup without a valid
	// meta is taken as one that never will have one.
	figuresUnfinished = time.Hour
)

// newestOfEachKind sets the figures of the newest backup of each kind from
// the newest figuresNames backups not dated in the future, and returns
// the newest of all, and of the timeline.
func (f *Figures) newestOfEachKind(ctx context.Context, s FiguresStore, timeline string) (StoreFigures, error) {
	var out StoreFigures
	names, err := backup.Names(ctx, s)
	if err != nil {
		return out, err
	}
	notAfter := f.now().Add(spec.FutureSkew)
	for len(names) > 0 {
		at, _ := backup.NameTime(names[len(names)-1])
		if !at.After(notAfter) {
			break
		}
		out.future(names[len(names)-1])
		names = names[:len(names)-1]
	}
	names = names[max(0, len(names)-figuresNames):]
	kept := make(map[string]*backup.Meta, len(names))
	seen := map[string]bool{}
	reads := 0
	for i := len(names) - 1; i >= 0; i-- {
		name := names[i]
		cached, ok := f.metaCache[name]
		if !ok {
			if reads == figuresMetaReads {
				continue
			}
			reads++
			meta, err := backup.ReadMeta(ctx, s, name)
			switch {
			case errors.Is(err, backup.ErrNotFound) || errors.Is(err, backup.ErrCorrupt):
				// Being written, or no backup: once its name is old
				// enough for any upload to have ended, never read again.
				if at, ok := backup.NameTime(name); ok && f.now().Sub(at) > figuresUnfinished {
					kept[name] = nil
				}
				continue
			case err != nil:
				return out, err
			}
			cached = &meta
		}
		kept[name] = cached
		if cached == nil {
			continue
		}
		meta := *cached
		if in := (backup.Info{Name: name, Meta: meta}); in.DatedAfter(notAfter) {
			out.future(name)
			continue
		}
		if out.Newest == nil {
			out.Newest = &backup.Info{Name: name, Meta: meta}
		}
		if out.Drillable == nil && timeline != "" && meta.ClusterToken == timeline {
			out.Drillable = &backup.Info{Name: name, Meta: meta}
		}
		kind := meta.Kind
		if !spec.ValidBackupKind(kind) {
			kind = "other"
		}
		if !seen[kind] {
			seen[kind] = true
			f.met.backupFigures(meta)
		}
	}
	f.metaCache = kept
	// A kind not among the newest backups has no figures any more.
	for _, kind := range append(slices.Clone(spec.BackupKinds), "other") {
		if !seen[kind] {
			f.met.backupDuration.DeleteLabelValues(kind)
			f.met.backupSize.DeleteLabelValues(kind)
		}
	}
	return out, nil
}
