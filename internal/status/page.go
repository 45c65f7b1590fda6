package status

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// View is what the page shows, as the loop last saw it.
type View struct {
	Cluster, Node string
	Updated       time.Time
	Leader        string
	Members       []Member
	Backup        string
	BackupAt      time.Time
	Restorable    time.Time
	// Drill is the newest restore drill, nil before any.
	Drill     *spec.DrillResult
	Procedure string
	Warnings  []string
}

type Member struct {
	ID, Role, Version, Health string
	Healthy                   bool
}

// Page serves the page from the loop's last view; the events are
// read from the store at most every eventsFresh.
type Page struct {
	view atomic.Pointer[View]
	// Events reads the newest events (see StoreEvents); Now is the clock.
	Events func(ctx context.Context) ([]spec.Event, error)
	Now    func() time.Time

	mu       sync.Mutex
	cached   []spec.Event
	cachedAt time.Time
	cacheErr error
}

const (
	statusEvents = 15
	eventsFresh  = 10 * time.Second
)

// Facts are what the page shows beside the observation: what this
// agent knows of the store and its own settings.
type Facts struct {
	Cluster, Node string
	Now           time.Time
	// Procedure is the exclusive procedure in progress, "" for none.
	Procedure string
	Warnings  []string
	// Newest is the newest backup in the store, nil for none; Restorable
	// the newest point a restore can reach.
	Newest     *backup.Info
	Restorable time.Time
	// Drills is the restore drills' record, nil before any.
	Drills *spec.DrillRecord
}

// Build makes the page's view of one observation.
func Build(obs plan.Observed, f Facts) *View {
	v := &View{Cluster: f.Cluster, Node: f.Node, Updated: f.Now, Procedure: f.Procedure, Warnings: f.Warnings}
	for _, n := range obs.Peers {
		m := Member{ID: n.ID, Version: n.Version, Healthy: n.Healthy}
		switch {
		case n.Member == nil:
			m.Role = "standby"
		case n.MemberID != 0 && n.RaftLeader == n.MemberID:
			m.Role, v.Leader = "leader", n.ID
		default:
			m.Role = "member"
		}
		switch {
		case n.Member == nil:
			m.Health = "-"
		case n.Healthy:
			m.Health = "healthy"
		default:
			m.Health = "unhealthy"
		}
		v.Members = append(v.Members, m)
	}
	// Members whose agent this one cannot reach: from the leader's view of
	// the cluster, or this member's own copy of the membership.
	members := obs.Self.LocalMembers
	if obs.Cluster != nil {
		members = obs.Cluster.Members
	}
	for _, m := range members {
		name := m.Name
		if name == "" {
			name = fmt.Sprintf("%x (not started)", m.ID)
		}
		if !slices.ContainsFunc(v.Members, func(x Member) bool { return x.ID == m.Name }) {
			v.Members = append(v.Members, Member{ID: name, Role: "member", Health: "agent unreachable"})
		}
	}
	sort.Slice(v.Members, func(i, j int) bool { return v.Members[i].ID < v.Members[j].ID })
	if obs.StoreErr != nil {
		v.Warnings = append(slices.Clone(v.Warnings), "this agent cannot read the backup store: "+obs.StoreErr.Error())
	}
	if b := f.Newest; b != nil {
		v.Backup, v.BackupAt = b.Name, time.Unix(int64(b.Meta.Timestamp), 0)
	}
	v.Restorable = f.Restorable
	if d := f.Drills; d != nil {
		v.Drill = &d.Last
	}
	return v
}

// Show makes v the view the page serves.
func (p *Page) Show(v *View) { p.view.Store(v) }

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return now.Sub(t).Round(time.Second).String() + " ago"
	},
	"utc": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>etcd-manager: {{.V.Cluster}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.2em 0 .3em}
table{border-collapse:collapse}td,th{padding:.2em .8em .2em 0;text-align:left;vertical-align:top}
th{font-weight:600;border-bottom:1px solid #ccc}.ok{color:#1a7f37}.bad{color:#cf222e;font-weight:600}
.muted{color:#666}.warn{background:#fff8c5;padding:.3em .5em}.t{white-space:nowrap}
</style></head><body>
<h1>etcd cluster <span id="cluster">{{.V.Cluster}}</span></h1>
<div class="muted">as agent {{.V.Node}} saw it at {{utc .V.Updated}}; this page reloads every 10 s</div>
<h2>Members</h2>
<table id="members"><tr><th>node</th><th>role</th><th>etcd</th><th>health</th></tr>
{{range .V.Members}}<tr class="member"><td>{{.ID}}</td><td>{{.Role}}</td><td>{{.Version}}</td><td class="{{if .Healthy}}ok{{else}}bad{{end}}">{{.Health}}</td></tr>
{{else}}<tr><td colspan="4" class="muted">no agent seen yet</td></tr>{{end}}</table>
<div>leader: <b id="leader">{{if .V.Leader}}{{.V.Leader}}{{else}}none{{end}}</b></div>
<h2>Backups</h2>
<table><tr><td>newest backup</td><td id="backup">{{if .V.Backup}}{{.V.Backup}} ({{ago .Now .V.BackupAt}}){{else}}none{{end}}</td></tr>
<tr><td>newest restorable point</td><td id="rpo">{{if .V.Restorable.IsZero}}none{{else}}{{utc .V.Restorable}}: RPO {{ago .Now .V.Restorable}}{{end}}</td></tr>
<tr><td>last restore drill</td><td id="drill">{{with .V.Drill}}<span class="{{if eq .Outcome "ok"}}ok">passed{{else if eq .Outcome "failed"}}bad">failed{{else}}muted">could not run{{end}}</span> {{ago $.Now .Time}}{{if .Backup}}, backup {{.Backup}}{{end}}{{if .Message}}: {{.Message}}{{end}}{{else}}none{{end}}</td></tr></table>
<h2>In progress</h2>
<div id="procedure">{{if .V.Procedure}}{{.V.Procedure}}{{else}}<span class="muted">no procedure</span>{{end}}</div>
{{range .V.Warnings}}<div class="warn">{{.}}</div>{{end}}
<h2>Recent events</h2>
{{if .EventsErr}}<div class="bad">cannot read the history: {{.EventsErr}}</div>{{end}}
<table id="events"><tr><th>time</th><th>node</th><th>action</th><th>outcome</th><th>message</th></tr>
{{range .Events}}<tr><td class="t">{{utc .Time}}</td><td>{{.Node}}</td><td>{{.Action}}</td><td class="{{if eq .Outcome "ok"}}ok{{else}}bad{{end}}">{{.Outcome}}{{if gt .Count 1}} ×{{.Count}}{{end}}</td><td>{{.Message}}</td></tr>
{{else}}<tr><td colspan="5" class="muted">none</td></tr>{{end}}</table>
</body></html>
`))

func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v := p.view.Load()
	if v == nil {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	events, err := p.recentEvents()
	data := struct {
		V         *View
		Now       time.Time
		Events    []spec.Event
		EventsErr error
	}{v, p.Now(), events, err}
	var page bytes.Buffer
	if err := statusTemplate.Execute(&page, data); err != nil {
		http.Error(w, fmt.Sprintf("status page: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_, _ = w.Write(page.Bytes())
}

// recentEvents are the newest events, newest first, read at most every
// eventsFresh.
// A read is not tied to the request that asked, whose end would fail it
// for every other viewer.
func (p *Page) recentEvents() ([]spec.Event, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cachedAt.IsZero() && p.Now().Sub(p.cachedAt) < eventsFresh {
		return p.cached, p.cacheErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := p.Events(ctx)
	sort.Slice(evs, func(i, j int) bool { return evs[i].Time.After(evs[j].Time) })
	p.cached, p.cacheErr, p.cachedAt = evs, err, p.Now()
	return evs, err
}

// StoreEvents reads the newest events from the store at url.
func StoreEvents(url string) func(ctx context.Context) ([]spec.Event, error) {
	return func(ctx context.Context) ([]spec.Event, error) {
		s, err := store.Open(ctx, url, store.Options{})
		if err != nil {
			return nil, err
		}
		defer s.Close()
		evs, _, err := s.RecentEvents(ctx, statusEvents)
		return evs, err
	}
}
