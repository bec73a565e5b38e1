// Package claudetest finds the pinned Claude Code CLI that .ci/run installs
// into the project (.tools/claude, git-ignored) for tests that run the real
// CLI against internal/anthropicfake.
//
// A test that needs the CLI calls Path(t): without it the test fails when
// CI=true (CI installs it, so its absence is a broken set-up) and skips
// with the reason elsewhere.
package claudetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Version is the pinned CLI version .ci/run installs.
const Version = "2.1.330"

// Dir is where .ci/run installs the CLI, relative to the module root.
const Dir = ".tools/claude"

// Path returns the CLI's path, or fails (CI) / skips (elsewhere) the test.
func Path(t testing.TB) string {
	t.Helper()
	p, err := find()
	if err == "" {
		return p
	}
	msg := "the real Claude Code CLI is not installed: " + err +
		"; install it with `npm install --prefix " + Dir + " @anthropic-ai/claude-code@" + Version + "` (what .ci/run does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func find() (string, string) {
	if p := os.Getenv("FLEET_TEST_CLAUDE"); p != "" {
		return p, ""
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err.Error()
	}
	p := filepath.Join(root, Dir, "node_modules", ".bin", "claude")
	if _, err := os.Stat(p); err != nil {
		return "", "no " + p
	}
	out, err := exec.Command(p, "--version").Output()
	if err != nil {
		return "", p + " --version: " + err.Error()
	}
	if !strings.HasPrefix(strings.TrimSpace(string(out)), Version) {
		return "", p + " is " + strings.TrimSpace(string(out)) + ", not the pinned " + Version
	}
	return p, ""
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}
