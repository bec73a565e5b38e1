package envcache

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

// TakeSnapshot runs git status --porcelain -z --ignored
// --untracked-files=all in workdir (the checkout, from this machine) and
// stats every path it lists.
func TakeSnapshot(ctx context.Context, workdir string) (Snapshot, error) {
	cmd := exec.CommandContext(ctx, "git", "-c", "core.quotePath=false", "status", "--porcelain", "-z", "--ignored", "--untracked-files=all")
	cmd.Dir = workdir
	cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("envcache: git status: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseStatus(out, workdir), nil
}

// parseStatus reads porcelain v1 -z output: "XY path\x00", and for
// renames and copies the original path as its own field after.
func parseStatus(out []byte, workdir string) Snapshot {
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
		if fi, err := os.Lstat(filepath.Join(workdir, p)); err == nil {
			st.Exists, st.Size, st.MTime = true, fi.Size(), fi.ModTime().UnixNano()
		}
		s[strings.TrimSuffix(p, "/")] = st
	}
	return s
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
