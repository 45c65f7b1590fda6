// Package internal_test keeps the layering of the module's packages as
// docs/architecture.md states it: the test reads the document's table of
// packages and checks every import against it.
package internal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	module = "github.com/etcd-manager/etcd-manager"
	doc    = "../docs/architecture.md"
	// allTags makes go list see every file, those of the tests' hooks and
	// of the Kubernetes end-to-end test included.
	allTags = "disable_grpc_modules,testhooks,e2ekube"
)

type pkg struct {
	ImportPath   string
	Name         string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// rel is path relative to the module, or "" when it is not the module's.
func rel(path string) string {
	if path == module {
		return "."
	}
	r, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	return r
}

// packages lists every package of the module with its imports, as go list
// reports them, import paths relative to the module.
func packages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags="+allTags, "-json", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages of %s", len(pkgs), module)
	}
	return pkgs
}

// A row of the document's table: the packages it names and what they may
// import of ours (relative to the module). anything allows every package
// of ours but the mains.
type row struct {
	packages []string
	allowed  []string
	anything bool
}

var backticked = regexp.MustCompile("`([^`]+)`")

// docName resolves a name of the "may import" column: one with no cmd/,
// api/ or test/ in front is a package under internal/.
func docName(name string) string {
	for _, top := range []string{"cmd/", "api/", "test/", "hack/", "deploy/", "bench"} {
		if strings.HasPrefix(name, top) {
			return name
		}
	}
	return "internal/" + name
}

// parseDoc reads the table under "## Where each concern lives" and the
// line naming the test helpers.
func parseDoc(text string) (rows []row, helpers []string, err error) {
	_, section, ok := strings.Cut(text, "\n## Where each concern lives\n")
	if !ok {
		return nil, nil, errors.New("no section \"Where each concern lives\"")
	}
	lines := strings.Split(section, "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| package |") })
	if i < 0 || i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "|---") {
		return nil, nil, errors.New("no table of packages")
	}
	for _, l := range lines[i+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(l, "|")
		if len(cells) != 5 {
			return nil, nil, fmt.Errorf("row %q has %d cells, want 3", l, len(cells)-2)
		}
		var r row
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			r.packages = append(r.packages, m[1])
		}
		may := strings.TrimSpace(cells[3])
		switch may {
		case "anything":
			r.anything = true
		case "nothing":
		default:
			ms := backticked.FindAllStringSubmatch(may, -1)
			if len(ms) == 0 || strings.ReplaceAll(backticked.ReplaceAllString(may, ""), " ", "") != strings.Repeat(",", len(ms)-1) {
				return nil, nil, fmt.Errorf("row %q: the last column is neither anything, nothing nor a list of packages", l)
			}
			for _, m := range ms {
				r.allowed = append(r.allowed, docName(m[1]))
			}
		}
		if len(r.packages) == 0 {
			return nil, nil, fmt.Errorf("row %q names no package", l)
		}
		rows = append(rows, r)
	}
	m := regexp.MustCompile(`(?m)^Any package's own tests may also import the test helpers: (.*)\.$`).FindStringSubmatch(section)
	if m == nil {
		return nil, nil, errors.New("no line naming the test helpers")
	}
	for _, h := range backticked.FindAllStringSubmatch(m[1], -1) {
		helpers = append(helpers, docName(h[1]))
	}
	return rows, helpers, nil
}

// violations checks every package against the rows; the mains are the
// packages named main under cmd/.
func violations(rows []row, helpers []string, pkgs []pkg) []string {
	var out []string
	byPkg := map[string]row{}
	for _, r := range rows {
		for _, p := range r.packages {
			if _, dup := byPkg[p]; dup {
				out = append(out, fmt.Sprintf("%s has two rows", p))
			}
			byPkg[p] = r
		}
	}
	mains := map[string]bool{}
	exists := map[string]bool{}
	for _, p := range pkgs {
		exists[rel(p.ImportPath)] = true
		if p.Name == "main" && strings.HasPrefix(rel(p.ImportPath), "cmd/") {
			mains[rel(p.ImportPath)] = true
		}
	}
	for p := range byPkg {
		if !exists[p] {
			out = append(out, fmt.Sprintf("the table has a row for %s, which is no package", p))
		}
	}
	for _, p := range pkgs {
		self := rel(p.ImportPath)
		r, ok := byPkg[self]
		if !ok {
			out = append(out, fmt.Sprintf("%s has no row in the table", self))
			continue
		}
		check := func(imports []string, extra []string, what string) {
			for _, imp := range imports {
				ours := rel(imp)
				switch {
				case imp == "github.com/spf13/pflag" || imp == "github.com/spf13/cobra" || strings.HasPrefix(imp, "github.com/spf13/cobra/"):
					if !strings.HasPrefix(self, "cmd/") {
						out = append(out, fmt.Sprintf("%s: %s imports %s; flags live under cmd/", self, what, imp))
					}
				case self == "internal/plan" && ours == "" && strings.Contains(strings.SplitN(imp, "/", 2)[0], "."):
					out = append(out, fmt.Sprintf("%s: %s imports %s; plan imports nothing outside the standard library but spec", self, what, imp))
				case ours == "" || ours == self:
				case mains[ours]:
					out = append(out, fmt.Sprintf("%s: %s imports the main %s", self, what, ours))
				case r.anything || slices.Contains(r.allowed, ours) || slices.Contains(extra, ours):
				default:
					out = append(out, fmt.Sprintf("%s: %s imports %s, which its row does not allow", self, what, ours))
				}
			}
		}
		check(p.Imports, nil, "the package")
		check(slices.Concat(p.TestImports, p.XTestImports), helpers, "a test")
	}
	slices.Sort(out)
	return out
}

func TestLayering(t *testing.T) {
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	rows, helpers, err := parseDoc(string(text))
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	if len(rows) < 10 || len(helpers) == 0 {
		t.Fatalf("%s: %d rows and %d test helpers read", doc, len(rows), len(helpers))
	}
	for _, v := range violations(rows, helpers, packages(t)) {
		t.Errorf("%s: %s", doc, v)
	}
}

// TestCheckCatchesViolations plants each kind of violation in a small
// table and its packages.
func TestCheckCatchesViolations(t *testing.T) {
	table := "# x\n\n## Where each concern lives\n\n| package | what it holds | may import (of ours) |\n|---|---|---|\n" +
		"| `cmd/tool` | a main | anything |\n" +
		"| `internal/spec` | objects | nothing |\n" +
		"| `internal/plan` | decisions | `spec` |\n" +
		"| `internal/store` | the store | `spec` |\n" +
		"| `internal/gone` | a package since removed | nothing |\n" +
		"| `test/harness` | tests | anything |\n" +
		"\nAny package's own tests may also import the test helpers: `test/harness`.\n"
	rows, helpers, err := parseDoc(table)
	if err != nil {
		t.Fatal(err)
	}
	m := func(p string) string { return module + "/" + p }
	pkgs := []pkg{
		{ImportPath: m("cmd/tool"), Name: "main", Imports: []string{"github.com/spf13/cobra", m("internal/store")}},
		{ImportPath: m("internal/spec"), Name: "spec", Imports: []string{"fmt"}, TestImports: []string{m("test/harness")}},
		{ImportPath: m("internal/plan"), Name: "plan", Imports: []string{"sort", m("internal/spec"), m("internal/store"), "go.etcd.io/etcd/client/v3"}},
		{ImportPath: m("internal/store"), Name: "store", Imports: []string{m("internal/spec"), "github.com/spf13/pflag", m("cmd/tool")}, XTestImports: []string{m("internal/plan")}},
		{ImportPath: m("internal/extra"), Name: "extra"},
		{ImportPath: m("test/harness"), Name: "harness", Imports: []string{m("internal/store"), m("internal/plan")}},
	}
	got := violations(rows, helpers, pkgs)
	want := []string{
		"internal/extra has no row in the table",
		"internal/plan: the package imports go.etcd.io/etcd/client/v3; plan imports nothing outside the standard library but spec",
		"internal/plan: the package imports internal/store, which its row does not allow",
		"internal/store: a test imports internal/plan, which its row does not allow",
		"internal/store: the package imports github.com/spf13/pflag; flags live under cmd/",
		"internal/store: the package imports the main cmd/tool",
		"the table has a row for internal/gone, which is no package",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A last column that is prose, not a list, is refused.
	if _, _, err := parseDoc(strings.Replace(table, "| `spec` |", "| `spec`, but not `store` |", 1)); err == nil {
		t.Error("a last column in prose was read as a list")
	}
}
