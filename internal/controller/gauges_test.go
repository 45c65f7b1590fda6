package controller

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// docs/metrics.md has a line for every metric the agent's packages
// define, and none for a metric they do not.
func TestMetricsDocumented(t *testing.T) {
	defRE := regexp.MustCompile(`Name:\s*"(etcd_manager_[a-z_]+)"`)
	var defined []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range defRE.FindAllStringSubmatch(string(data), -1) {
			defined = append(defined, m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The registry of a real set of metrics holds the same names.
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		reg := prometheus.NewRegistry()
		newMetrics(reg)
		reg.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		if n := regexp.MustCompile(`fqName: "(etcd_manager_[a-z_]+)"`).FindStringSubmatch(d.String()); n != nil && !slices.Contains(defined, n[1]) {
			t.Errorf("%s is registered but not found in the sources", n[1])
		}
	}
	data, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, n := range regexp.MustCompile("(?m)^\\| `(etcd_manager_[a-z_]+)`").FindAllStringSubmatch(string(data), -1) {
		documented = append(documented, n[1])
	}
	if len(defined) < 30 || len(documented) == 0 {
		t.Fatalf("found %d metrics defined, %d documented", len(defined), len(documented))
	}
	for _, n := range defined {
		if !slices.Contains(documented, n) {
			t.Errorf("%s is not in docs/metrics.md", n)
		}
	}
	for _, n := range documented {
		if !slices.Contains(defined, n) {
			t.Errorf("docs/metrics.md lists %s, which no package defines", n)
		}
	}
}
