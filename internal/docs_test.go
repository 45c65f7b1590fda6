package internal_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README is a product page: what it is, the two commands, how it
// fits together, and links. Figures and their history live in docs/ and
// bench/results/.
func TestREADMEIsAProductPage(t *testing.T) {
	const max = 12 << 10
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > max {
		t.Errorf("README.md is %d bytes, over %d: move the detail to docs/", len(b), max)
	}
	for _, want := range []string{"make demo", "make test"} {
		if i := strings.Index(string(b), want); i < 0 || i > 1024 {
			t.Errorf("README.md does not start with %q", want)
		}
	}
}

// linkRE matches a Markdown link's target.
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Every relative link in the README, the changelog and docs/ leads to a
// file that exists, and an anchor to a heading of it.
func TestDocsLinks(t *testing.T) {
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../README.md", "../CHANGELOG.md")
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !hasAnchor(t, path, anchor) {
				t.Errorf("%s links to %s, whose page has no heading %q", page, target, anchor)
			}
		}
	}
}

// hasAnchor reports whether the Markdown page at path has a heading whose
// GitHub anchor is anchor.
func hasAnchor(t *testing.T, path, anchor string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var a strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
				a.WriteRune(r)
			}
		}
		if a.String() == anchor {
			return true
		}
	}
	return false
}
