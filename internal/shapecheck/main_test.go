package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPkgImportsNothingFromInternal holds the repository to the rule: no
// production package under pkg/ imports one under internal/.
func TestPkgImportsNothingFromInternal(t *testing.T) {
	problems, err := check(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.Contains(p, "imports nothing from internal/") {
			t.Error(p)
		}
	}
}

// TestInternalImportUnderPkgReported checks the rule on a tree made for it:
// a production file under pkg/ importing internal/ is reported; tests,
// internal/ itself and pkg/internal/ are not.
func TestInternalImportUnderPkgReported(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"go.mod":                 "module example.com/m\n\ngo 1.26\n",
		"pkg/a/a.go":             "package a\n\nimport _ \"example.com/m/internal/b\"\n",
		"pkg/a/a_test.go":        "package a\n\nimport _ \"example.com/m/internal/b\"\n",
		"pkg/c/c.go":             "package c\n\nimport _ \"example.com/m/pkg/internal/d\"\n",
		"pkg/internal/d/d.go":    "package d\n",
		"internal/b/b.go":        "package b\n\nimport _ \"example.com/m/internal/e\"\n",
		"internal/e/e.go":        "package e\n",
		"cmd/x/main.go":          "package main\n\nimport _ \"example.com/m/internal/b\"\n\nfunc main() {}\n",
		"pkg/f/internal_name.go": "package f\n\nimport _ \"example.com/other/internal/g\"\n",
	}
	for name, text := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	problems, err := check(root)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "pkg", "a", "a.go") + ": imports example.com/m/internal/b (a package under pkg/ imports nothing from internal/)"
	if len(problems) != 1 || problems[0] != want {
		t.Fatalf("problems = %q, want [%q]", problems, want)
	}
}
