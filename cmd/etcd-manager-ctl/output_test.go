package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

// outputEnv is a store with a spec, one whole backup and a CA, so that
// every command has something to report.
func outputEnv(t *testing.T) ctlEnv {
	t.Helper()
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	e.plantBackup(t, "2026-11-22T05:00:00Z-000001", []byte(`{"etcdVersion":"3.6.16","timestamp":"1795410000","clusterToken":"tok1","revision":5}`), []byte("gz"))
	e.putStoreCA(t, storeObject(mustCA(t, time.Now().Add(-time.Hour), 365*24*time.Hour)))
	return e
}

// outputCase is one command whose result TestEveryCommandPrintsJSONAndYAML
// checks.
type outputCase struct {
	name     string
	args     func(t *testing.T, e ctlEnv) []string
	wantCode int
	// wantField is a field the result has at its top level (or in
	// its first element).
	wantField string
	// noResult: the command fails before it has one.
	noResult bool
}

// Every command prints its result as JSON and as YAML of the same
// values, alone on stdout, and keeps its exit status: 1 for a status
// with no agent, 3 for a --wait that timed out with the command queued.
func TestEveryCommandPrintsJSONAndYAML(t *testing.T) {
	noAgent := []string{"--insecure", "--discovery=static:127.0.0.1:1"}
	tests := []outputCase{
		{name: "get", args: fixed("get"), wantField: "memberCount"},
		{name: "list-backups", args: fixed("list-backups"), wantField: "name"},
		{name: "list-backups --ranges", args: fixed("list-backups", "--ranges"), wantField: "timeline"},
		{name: "configure-cluster", args: fixed("configure-cluster", "--member-count=3"), wantField: "spec"},
		{name: "backup-now --wait=false", args: fixed("backup-now", "--wait=false"), wantField: "command"},
		{name: "backup-now timing out", args: fixed("backup-now", "--timeout=300ms"), wantCode: exitQueued, noResult: true},
		{name: "defrag --wait=false", args: fixed("defrag", "--wait=false"), wantField: "command"},
		{name: "recover-quorum timing out", args: fixed("recover-quorum", "--timeout=300ms"), wantCode: exitQueued, noResult: true},
		{name: "restore-backup --wait=false", args: fixed("restore-backup", "2026-11-22T05:00:00Z-000001", "--wait=false"), wantField: "command"},
		{name: "restore-backup timing out", args: fixed("restore-backup", "--latest", "--timeout=300ms"), wantCode: exitQueued, noResult: true},
		{name: "list-commands", args: func(t *testing.T, e ctlEnv) []string {
			if _, _, err := e.run(t, "backup-now", "--wait=false"); err != nil {
				t.Fatal(err)
			}
			return []string{"list-commands"}
		}, wantField: "kind"},
		{name: "delete-command", args: func(t *testing.T, e ctlEnv) []string {
			id, _, err := e.run(t, "backup-now", "--wait=false")
			if err != nil {
				t.Fatal(err)
			}
			return []string{"delete-command", strings.TrimSpace(id)}
		}, wantField: "state"},
		{name: "events", args: fixed("events"), wantField: ""},
		{name: "version", args: fixed("version"), wantField: "goVersion"},
		{name: "status with no agent", args: fixed(append(noAgent, "status")...), wantCode: exitFailed, wantField: "storeOnly"},
		{name: "rotate-ca status", args: fixed("rotate-ca", "status"), wantField: "inProgress"},
		{name: "issue-client-cert", args: func(t *testing.T, _ ctlEnv) []string {
			return []string{"issue-client-cert", "--out", filepath.Join(t.TempDir(), "certs")}
		}, wantField: "commonName"},
		{name: "doctor", args: fixed("doctor", "--listen-address=127.0.0.1", "--ports=1"), wantCode: exitFailed, wantField: "check"},
		{name: "configure-cluster --dry-run", args: fixed("configure-cluster", "--member-count=3", "--dry-run"), wantField: "changes"},
		{name: "revoke-node", args: fixed("revoke-node", "gone", "--force"), wantField: "serials"},
		{name: "restore-backup --dry-run", args: fixed("restore-backup", "2026-11-22T05:00:00Z-000001", "--dry-run"), wantField: "segments"},
	}
	for _, tt := range tests {
		// An output format the ctl does not write is a usage error,
		// before the command does anything.
		t.Run(tt.name+"/unknown format", func(t *testing.T) {
			e := outputEnv(t)
			args := append(tt.args(t, e), "-o", "xml")
			out, _, err := e.run(t, args...)
			if exitCode(err) != exitUsage || out != "" {
				t.Errorf("%v: exit %d (%v), stdout %q; want a usage error and nothing printed", args, exitCode(err), err, out)
			}
		})
		for _, format := range []string{formatJSON, formatYAML} {
			t.Run(tt.name+"/"+format, func(t *testing.T) {
				e := outputEnv(t)
				args := append(tt.args(t, e), "-o", format)
				out, errOut, err := e.run(t, args...)
				if got := exitCode(err); (err == nil && tt.wantCode != 0) || (err != nil && got != tt.wantCode) {
					t.Fatalf("%v: exit %d (%v), want %d; stderr %s", args, got, err, tt.wantCode, errOut)
				}
				if tt.noResult {
					if out != "" {
						t.Errorf("%v printed %q on stdout, want nothing but a result", args, out)
					}
					return
				}
				v := decode(t, format, out)
				if tt.wantField != "" && !hasField(v, tt.wantField) {
					t.Errorf("%v printed no field %q:\n%s", args, tt.wantField, out)
				}
			})
		}
	}
}

func fixed(args ...string) func(*testing.T, ctlEnv) []string {
	return func(*testing.T, ctlEnv) []string { return args }
}

// decode parses a result as its format says, failing on anything else
// on stdout.
func decode(t *testing.T, format, out string) any {
	t.Helper()
	var v any
	var err error
	if format == formatJSON {
		err = json.Unmarshal([]byte(out), &v)
	} else {
		err = yaml.Unmarshal([]byte(out), &v)
	}
	if err != nil || out == "" {
		t.Fatalf("stdout is not %s (%v):\n%s", format, err, out)
	}
	return v
}

func hasField(v any, name string) bool {
	if l, ok := v.([]any); ok && len(l) > 0 {
		v = l[0]
	}
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	_, ok = m[name]
	return ok
}

// YAML holds the same values as the JSON, in the JSON's field order,
// with the strings that read as another type quoted, and what a terminal
// could act on escaped.
func TestWriteYAML(t *testing.T) {
	type inner struct {
		When  time.Time `json:"when"`
		Count int       `json:"count"`
	}
	v := struct {
		Zebra   string   `json:"zebra"`
		Apple   string   `json:"apple"`
		Number  string   `json:"number"`
		Truthy  string   `json:"truthy"`
		Hostile string   `json:"hostile"`
		Ratio   float64  `json:"ratio"`
		None    *int     `json:"none"`
		Empty   []string `json:"empty"`
		Inner   []inner  `json:"inner"`
	}{Zebra: "z", Apple: "a", Number: "007", Truthy: "yes", Hostile: "a\x1b]0;owned\x07b\u202ec\u0085d",
		Ratio: 0.25, Empty: []string{}, Inner: []inner{{When: time.Date(2026, 12, 4, 1, 2, 3, 0, time.UTC), Count: 3}}}
	var b bytes.Buffer
	if err := writeYAML(&b, v); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	checkTerminalSafe(t, "yaml", out)
	if strings.Index(out, "zebra:") > strings.Index(out, "apple:") {
		t.Errorf("fields out of the JSON's order:\n%s", out)
	}
	var fromYAML map[string]any
	if err := yaml.Unmarshal(b.Bytes(), &fromYAML); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	doc, _ := json.Marshal(v)
	var fromJSON map[string]any
	if err := json.Unmarshal(doc, &fromJSON); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(fromYAML)
	want, _ := json.Marshal(fromJSON)
	if !bytes.Equal(a, want) {
		t.Errorf("YAML reads back as\n%s\nwant\n%s\nYAML:\n%s", a, want, out)
	}
}
