// Package internal_test keeps the layering of the packages under
// internal/, as docs/architecture.md draws it.
package internal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/etcd-manager/etcd-manager"

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// packages lists every package of the module with its imports, as go list
// reports them.
func packages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
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

// standard reports whether path is a standard library package: its first
// element has no dot.
func standard(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// check returns the imports that allowed refuses.
func check(imports []string, allowed func(string) bool) []string {
	var bad []string
	for _, imp := range imports {
		if !allowed(imp) {
			bad = append(bad, imp)
		}
	}
	return bad
}

func TestLayering(t *testing.T) {
	pkgs := packages(t)
	ours := func(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }
	rules := []struct {
		name    string
		applies func(pkg) bool
		allowed func(string) bool
	}{
		{
			name:    "internal/plan imports only the standard library and internal/spec",
			applies: func(p pkg) bool { return p.ImportPath == module+"/internal/plan" },
			allowed: func(imp string) bool { return standard(imp) || imp == module+"/internal/spec" },
		},
		{
			name:    "internal/spec imports nothing of ours",
			applies: func(p pkg) bool { return p.ImportPath == module+"/internal/spec" },
			allowed: func(imp string) bool { return !ours(imp) },
		},
		{
			name:    "internal/procedure reaches nodes through its own interfaces, and never the loop",
			applies: func(p pkg) bool { return p.ImportPath == module+"/internal/procedure" },
			allowed: func(imp string) bool { return imp != module+"/internal/controller" && imp != module+"/internal/node" },
		},
		{
			name:    "internal/node carries out what it is told, and never decides or drives",
			applies: func(p pkg) bool { return p.ImportPath == module+"/internal/node" },
			allowed: func(imp string) bool {
				return imp != module+"/internal/controller" && imp != module+"/internal/procedure"
			},
		},
		{
			name:    "nothing imports a cmd/ package",
			applies: func(pkg) bool { return true },
			allowed: func(imp string) bool { return !strings.HasPrefix(imp, module+"/cmd/") },
		},
	}
	for _, r := range rules {
		applied := false
		for _, p := range pkgs {
			if !r.applies(p) {
				continue
			}
			applied = true
			// A package's own tests may import what it may; plan's table
			// tests, say, need nothing else either.
			all := slices.Concat(p.Imports, p.TestImports, p.XTestImports)
			all = slices.DeleteFunc(all, func(imp string) bool { return imp == p.ImportPath })
			if bad := check(all, r.allowed); len(bad) > 0 {
				t.Errorf("%s: %s imports %v", r.name, p.ImportPath, bad)
			}
		}
		if !applied {
			t.Errorf("%s: no package to check; was it moved?", r.name)
		}
	}
}

// TestCheckCatchesViolations makes sure the rules above can fail.
func TestCheckCatchesViolations(t *testing.T) {
	allowed := func(imp string) bool { return standard(imp) || imp == module+"/internal/spec" }
	got := check([]string{"fmt", module + "/internal/spec", module + "/internal/store", "go.etcd.io/etcd/client/v3"}, allowed)
	want := []string{module + "/internal/store", "go.etcd.io/etcd/client/v3"}
	if !slices.Equal(got, want) {
		t.Errorf("check = %v, want %v", got, want)
	}
}
