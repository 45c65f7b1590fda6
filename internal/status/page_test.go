package status

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The page shows the members, the leader, the newest backup, the RPO, the
// procedure and the newest events first, with text from the store and
// the peers escaped; it reads the history at most every eventsFresh, and
// says when it cannot.
func TestStatusPage(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	reads := 0
	var readErr error
	p := &Page{Now: func() time.Time { return now }, Events: func(context.Context) ([]spec.Event, error) {
		reads++
		return []spec.Event{
			{Time: now.Add(-time.Hour), Node: "a", Action: "add-member b", Outcome: spec.EventOK},
			{Time: now.Add(-time.Minute), Node: "a", Action: "take-backup (periodic)", Outcome: spec.EventFailed, Message: `<script>alert(1)</script>`, Count: 3},
		}, readErr
	}}
	get := func() (int, string) {
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status", nil))
		return w.Code, w.Body.String()
	}
	if code, _ := get(); code != http.StatusServiceUnavailable {
		t.Fatalf("before the first cycle: %d", code)
	}
	p.view.Store(&View{Cluster: "main", Node: "a", Updated: now, Leader: "a", Procedure: "restore-backup restoring",
		Members: []Member{{ID: "a", Role: "leader", Version: "3.6.16", Health: "healthy", Healthy: true}, {ID: "b<i>", Role: "member", Health: "unhealthy"}},
		Backup:  "2026-11-24T11:45:00Z-000001", BackupAt: now.Add(-15 * time.Minute), Restorable: now.Add(-15 * time.Minute),
		Warnings: []string{"a member is down"}})
	code, body := get()
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	for _, want := range []string{`<span id="cluster">main</span>`, `<td>a</td><td>leader</td><td>3.6.16</td><td class="ok">healthy</td>`,
		`<td>b&lt;i&gt;</td>`, `class="bad">unhealthy`, "2026-11-24T11:45:00Z-000001 (15m0s ago)", "RPO 15m0s ago", "restore-backup restoring",
		"a member is down", "&lt;script&gt;alert(1)&lt;/script&gt;", "failed ×3", `http-equiv="refresh"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script") || strings.Contains(body, "src=") {
		t.Error("the page holds a script or an external asset")
	}
	if strings.Index(body, "take-backup") > strings.Index(body, "add-member b") {
		t.Error("the events are not newest first")
	}
	get()
	if reads != 1 {
		t.Errorf("the history was read %d times within %s", reads, eventsFresh)
	}
	now = now.Add(eventsFresh)
	readErr = errors.New("store away")
	if _, body := get(); reads != 2 || !strings.Contains(body, "cannot read the history: store away") {
		t.Errorf("reads %d; a failed read is not shown", reads)
	}
}

// A member whose agent cannot be reached is on the page as such, from the
// leader's view of the cluster, and so is a store this agent cannot read.
func TestStatusViewShowsUnreachableMembers(t *testing.T) {
	obs := plan.Observed{
		Self:     plan.Node{ID: "a"},
		Peers:    []plan.Node{{ID: "a", Member: &plan.Membership{}, Healthy: true, MemberID: 1, RaftLeader: 1}},
		Cluster:  &plan.ClusterView{Members: []plan.Member{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3}}},
		StoreErr: errors.New("store away"),
	}
	v := Build(obs, Facts{Cluster: "main", Node: "a", Now: time.Now()})
	var rows []string
	for _, m := range v.Members {
		rows = append(rows, m.ID+" "+m.Role+" "+m.Health)
	}
	want := "3 (not started) member agent unreachable|a leader healthy|b member agent unreachable"
	if got := strings.Join(rows, "|"); got != want || v.Leader != "a" {
		t.Fatalf("members %q leader %q; want %q", got, v.Leader, want)
	}
	if len(v.Warnings) != 1 || !strings.Contains(v.Warnings[0], "store away") {
		t.Errorf("warnings %q", v.Warnings)
	}
}
