package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// events prints the history oldest first, within --since, with repeats
// counted and text from the store escaped; junk is named on stderr and
// the rest still prints; -o json gives the records.
func TestEvents(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(t.Context(), e.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	for _, ev := range []spec.Event{
		{Time: now.Add(-48 * time.Hour), Node: "n1", Action: "add-member old", Outcome: spec.EventOK},
		{Time: now.Add(-2 * time.Hour), Node: "n1", Action: "add-member b", Outcome: spec.EventOK},
		{Time: now.Add(-time.Hour), Node: "n2", Action: "take-backup (periodic)", Outcome: spec.EventFailed, Message: "store away\x1b[2J", Count: 4, Since: now.Add(-90 * time.Minute)},
	} {
		if err := s.AddEvent(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Write(t.Context(), store.EventPrefix+"00000000000000000001-junk.json", []byte("{")); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := e.run(t, "events")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "add-member b") || !strings.Contains(lines[2], "failed x4 since") {
		t.Fatalf("events:\n%s", out)
	}
	if strings.Contains(out, "\x1b") || !strings.Contains(out, `store away\x1b[2J`) {
		t.Errorf("the message is not escaped:\n%q", out)
	}
	if strings.Contains(errOut, "junk") {
		t.Errorf("an event from before --since was read: %s", errOut)
	}
	out, errOut, err = e.run(t, "events", "--since=0", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got []spec.Event
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 3 || got[0].Action != "add-member old" {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if !strings.Contains(errOut, "junk.json cannot be read") {
		t.Errorf("stderr does not name the junk: %q", errOut)
	}
	if _, _, err := e.run(t, "events", "--since=-1h"); err == nil {
		t.Error("a negative --since was taken")
	}
}
