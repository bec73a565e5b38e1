package envcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// State is one path of a snapshot: its git status and, for a file, size
// and modification time.
type State struct {
	Status string // the two status letters ("??", "!!", " M", …)
	Size   int64
	MTime  int64 // nanoseconds
	Exists bool
}

// Snapshot is the state of every path git reports in a checkout as new,
// modified, untracked or ignored.
type Snapshot map[string]State

// statusArgs list what git reports as new, modified, untracked or ignored,
// with the same hardening the workspace's own git calls have.
var statusArgs = []string{"git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
	"-c", "core.quotePath=false", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
	"status", "--porcelain", "-z", "--ignored", "--untracked-files=all"}

// statusEnv is git status's environment: the hardening of the workspace's git calls
// hardening (no system or global configuration: a contained sandbox's
// agent uid may not read the host's), and no optional locks.
var statusEnv = map[string]string{"GIT_OPTIONAL_LOCKS": "0", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}

// TakeSnapshot runs git status --porcelain -z --ignored
// --untracked-files=all in sb's checkout and stats every path it lists
// from this machine (sb must implement sandbox.HostWorkDir). git runs
// inside the sandbox, never on the host: after a setup script ran, the
// checkout's .git/config is the tenant's to write, and git may run
// commands it names (filters, fsmonitor).
func TakeSnapshot(ctx context.Context, sb sandbox.Sandbox) (Snapshot, error) {
	hd, ok := sb.(sandbox.HostWorkDir)
	if !ok {
		return nil, errors.New("envcache: the sandbox's checkout is not on this machine")
	}
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "envcache-status-" + random(), Argv: statusArgs, Env: statusEnv})
	if err != nil {
		return nil, fmt.Errorf("envcache: git status: %w", err)
	}
	out, rerr := io.ReadAll(io.LimitReader(p.Stdout(), maxStatusBytes+1))
	_, _ = io.Copy(io.Discard, p.Stdout())
	st, err := p.Wait(ctx)
	switch {
	case err != nil:
		return nil, fmt.Errorf("envcache: git status: %w", err)
	case rerr != nil:
		return nil, fmt.Errorf("envcache: git status: %w", rerr)
	case st.Code != 0:
		return nil, fmt.Errorf("envcache: git status exited with status %d: %s", st.Code, strings.TrimSpace(st.StderrTail))
	case len(out) > maxStatusBytes:
		return nil, fmt.Errorf("envcache: git status listed more than %d MiB of paths", maxStatusBytes>>20)
	}
	return parseStatus(out, hd.HostWorkDir())
}

// maxStatusBytes bounds git status's output (some hundred thousand paths).
const maxStatusBytes = 64 << 20

// parseStatus reads porcelain v1 -z output: "XY path\x00", and for
// renames and copies the original path as its own field after.
func parseStatus(out []byte, workdir string) (Snapshot, error) {
	root, err := os.OpenRoot(workdir)
	if err != nil {
		return nil, fmt.Errorf("envcache: %w", err)
	}
	defer root.Close()
	s := Snapshot{}
	fields := strings.Split(string(out), "\x00")
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if len(f) < 4 {
			continue
		}
		xy, p := f[:2], f[3:]
		if xy[0] == 'R' || xy[0] == 'C' {
			i++ // the source path
		}
		st := State{Status: xy}
		if fi, err := root.Lstat(strings.TrimSuffix(p, "/")); err == nil {
			st.Exists, st.Size, st.MTime = true, fi.Size(), fi.ModTime().UnixNano()
		}
		s[strings.TrimSuffix(p, "/")] = st
	}
	return s, nil
}

// Changed lists, sorted, the paths of after that exist and are new or
// differ from before: what a setup left in the checkout.
func Changed(before, after Snapshot) []string {
	var out []string
	for p, st := range after {
		if !st.Exists {
			continue
		}
		if b, ok := before[p]; ok && b == st {
			continue
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
