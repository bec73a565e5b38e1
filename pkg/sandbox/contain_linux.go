package sandbox

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/rawio"
)

// killWait bounds how long killAll waits for killed processes to be gone.
const killWait = 30 * time.Second

// newContainment returns the containment for mode (one of the Contain*
// constants, validated). ContainAuto falls back to ContainEnviron with the
// reason cgroups could not be used.
func newContainment(mode string) (containment, string, error) {
	switch mode {
	case ContainGroup:
		return groupOnly{}, "", nil
	case ContainEnviron:
		return environContainment{}, "", nil
	}
	cg, err := cgroupBase()
	if err == nil {
		return cg, "", nil
	}
	if mode == ContainCgroup {
		return nil, "", err
	}
	return environContainment{}, err.Error(), nil
}

// # cgroup v2

// cgroupContainment puts each process in a cgroup of its own under base, a
// group of the worker's own cgroup named agentfleet-<worker pid>, which
// exists while some run does and for idleFor after the last one.
//
// A run's group is made once and reused: a run that ended with its group
// found empty (nothing of it left alive) hands the group, and the open
// directory that clone3 starts the next process in, to the next run,
// where making and removing a group costs the kernel about 80 µs per run
// and reading it empty 10 µs. Only a group found empty is reused: one
// that held processes to kill is removed once they are gone (or left,
// with the error reported), as is one that a failed start leaves.
type cgroupContainment struct {
	base  string
	kill  bool // cgroup.kill exists (Linux 5.14+)
	seq   atomic.Int64
	noFD  atomic.Bool // clone3 CLONE_INTO_CGROUP failed once: move the pid after start instead
	sweep int         // stale groups of dead workers removed at start (for the log)
	// idleFor is how long the empty groups kept for reuse, and base, outlive
	// the last run (defaultGroupIdle when zero).
	idleFor time.Duration
	// maxIdle caps the groups kept for reuse: groupPoolMax when zero, none
	// when negative (a group per run, as BenchmarkCgroupRun's baseline).
	maxIdle int

	mu    sync.Mutex
	runs  int           // groups handed out and not yet released
	idle  []cgroupGroup // empty groups kept for the next runs, at most groupPoolMax
	timer *time.Timer   // trims idle groups and base once no run is left
}

// cgroupGroup is an empty group kept for reuse: its directory and, unless
// clone3 cannot use it, the directory's open descriptor.
type cgroupGroup struct {
	dir string
	fd  int
}

const (
	groupPoolMax     = 64
	defaultGroupIdle = 10 * time.Second
)

// cgroupBase finds the worker's cgroup v2 group and creates (once per worker
// process) the base group of the runs in it. It fails when there is no
// cgroup v2 hierarchy or it cannot be written (a container's read-only
// /sys/fs/cgroup, a non-root user without delegation).
var cgroupBase = sync.OnceValues(func() (*cgroupContainment, error) {
	own, err := ownCgroupDir()
	if err != nil {
		return nil, fmt.Errorf("sandbox: cgroup v2: %w", err)
	}
	c := &cgroupContainment{base: filepath.Join(own, "agentfleet-"+strconv.Itoa(os.Getpid()))}
	c.sweep = sweepStaleCgroups(own)
	if err := os.Mkdir(c.base, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandbox: cgroup v2: create %s: %w", c.base, err)
	}
	// Creating a directory may succeed where moving processes does not
	// (delegation); find out now rather than at the first run.
	probe := filepath.Join(c.base, "probe")
	if err := os.Mkdir(probe, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandbox: cgroup v2: create %s: %w", probe, err)
	}
	defer func() {
		_ = os.Remove(probe)
		_ = os.Remove(c.base) // recreated by each run
	}()
	if err := unix.Access(filepath.Join(probe, "cgroup.procs"), unix.W_OK); err != nil {
		return nil, fmt.Errorf("sandbox: cgroup v2: %s/cgroup.procs not writable: %w", probe, err)
	}
	_, err = os.Stat(filepath.Join(c.base, "cgroup.kill"))
	c.kill = err == nil
	return c, nil
})

// ownCgroupDir returns the directory of this process's cgroup v2 group.
func ownCgroupDir() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	path, ok := "", false
	for line := range strings.SplitSeq(string(b), "\n") {
		if p, found := strings.CutPrefix(line, "0::"); found {
			path, ok = p, true
		}
	}
	if !ok {
		return "", errors.New("no cgroup v2 group in /proc/self/cgroup")
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) < 5 {
			continue
		}
		root, mnt := unescapeMountinfo(fields[3]), unescapeMountinfo(fields[4])
		rel, ok := strings.CutPrefix(path, root)
		if root == "/" {
			rel, ok = path, true
		}
		if !ok {
			continue
		}
		dir := filepath.Join(mnt, rel)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("cgroup v2 hierarchy not mounted")
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sweepStaleCgroups kills and removes the groups agentfleet-<pid> under own
// whose worker is gone (a worker killed with SIGKILL leaves its runs'
// detached processes behind). It returns how many it removed.
func sweepStaleCgroups(own string) int {
	entries, err := os.ReadDir(own)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pidStr, ok := strings.CutPrefix(e.Name(), "agentfleet-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || !e.IsDir() || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // that worker still runs (or is not ours to judge)
		}
		if removeCgroupTree(filepath.Join(own, e.Name())) == nil {
			n++
		}
	}
	return n
}

// removeCgroupTree kills every process in the group dir and its children
// and removes them, deepest first.
func removeCgroupTree(dir string) error {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			_ = removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	if _, err := killCgroup(dir, fileExists(filepath.Join(dir, "cgroup.kill"))); err != nil {
		return err
	}
	return rmdirCgroup(dir)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func (c *cgroupContainment) mode() string { return ContainCgroup }

func (c *cgroupContainment) newRun(string, string) (containedRun, error) {
	c.mu.Lock()
	c.runs++
	if n := len(c.idle); n > 0 {
		g := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return &cgroupRun{c: c, dir: g.dir, fd: g.fd}, nil
	}
	c.mu.Unlock()
	dir := filepath.Join(c.base, strconv.FormatInt(c.seq.Add(1), 10))
	// Base is usually there (one mkdir, where MkdirAll would stat twice
	// first). trim removes it once no run is left, which may be right
	// between the making of base and of dir; then again.
	err := unix.Mkdir(dir, 0o755)
	for i := 0; i < 10 && errors.Is(err, unix.ENOENT); i++ {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		c.done(nil)
		return nil, fmt.Errorf("sandbox: create cgroup %s: %w: %v", dir, ErrUnavailable, err)
	}
	r := &cgroupRun{c: c, dir: dir, fd: -1}
	if !c.noFD.Load() {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			r.fd = fd
		}
	}
	return r, nil
}

// done ends a run: g, when not nil, is its group, found empty, for the next
// run. The last run arms the trim.
func (c *cgroupContainment) done(g *cgroupGroup) {
	c.mu.Lock()
	c.runs--
	limit := c.maxIdle
	if limit == 0 {
		limit = groupPoolMax
	}
	keep := g != nil && len(c.idle) < limit
	if keep {
		c.idle = append(c.idle, *g)
	}
	if c.runs == 0 {
		idle := cmp.Or(c.idleFor, defaultGroupIdle)
		if c.timer == nil {
			c.timer = time.AfterFunc(idle, c.trim)
		} else {
			c.timer.Reset(idle)
		}
	}
	c.mu.Unlock()
	if g != nil && !keep {
		removeGroup(*g)
	}
}

// trim removes the idle groups and base when no run is left: a worker
// that has been idle for idleFor, or stops (Local.Close), leaves nothing
// behind. A run made meanwhile keeps base busy, or makes it again.
func (c *cgroupContainment) trim() {
	c.mu.Lock()
	if c.runs > 0 {
		c.mu.Unlock()
		return
	}
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, g := range idle {
		removeGroup(g)
	}
	_ = unix.Rmdir(c.base)
}

func removeGroup(g cgroupGroup) {
	if g.fd >= 0 {
		_ = unix.Close(g.fd)
	}
	_ = rmdirCgroup(g.dir)
}

// cgroupRun is one process's group.
type cgroupRun struct {
	c   *cgroupContainment
	dir string
	fd  int // the group's directory, for CLONE_INTO_CGROUP; -1 when not used
	// useFD: the last prepare asked clone3 to start the process in the group.
	useFD bool
	// empty: killAll found the group empty (nothing of the run was left
	// alive, nothing killed); released: release ran.
	empty, released bool
}

func (r *cgroupRun) prepare(cmd *exec.Cmd) {
	r.useFD = r.fd >= 0 && !r.c.noFD.Load()
	if r.useFD {
		// The child starts inside the group: nothing it does can happen
		// outside it, not even a fork before its first instruction.
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = r.fd
	}
}

func (r *cgroupRun) startFailed(err error) bool {
	var ee *exec.Error
	var pe *os.PathError
	if !r.useFD || errors.As(err, &ee) || errors.As(err, &pe) && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOSYS) {
		return false
	}
	// clone3 with CLONE_INTO_CGROUP is not supported (kernel < 5.7, or a
	// seccomp filter): move each process into its group after start.
	r.c.noFD.Store(true)
	return true
}

func (r *cgroupRun) started(pid int) error {
	if r.useFD {
		return nil // the descriptor goes back to the pool with the group
	}
	r.closeFD()
	// The process was just created and has not run the agent yet; moving it
	// now catches anything it starts.
	if err := os.WriteFile(filepath.Join(r.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("sandbox: move pid %d into cgroup %s: %w", pid, r.dir, err)
	}
	return nil
}

func (r *cgroupRun) closeFD() {
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}

func (r *cgroupRun) killAll() (int, error) {
	// Most often the agent left nothing behind: one read says so.
	pids, err := cgroupPIDs(r.dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, nil // removed under us: nothing to kill, nothing to reuse
	case err != nil:
		return 0, err
	case len(pids) == 0:
		r.empty = true
		return 0, nil
	}
	// A group that needed killing is not handed on, even once empty: after
	// a write to its cgroup.kill, some kernels (6.18 here) kill every
	// process later started in it with CLONE_INTO_CGROUP (cgroup_post_fork
	// compares the kill count of the parent's group with the new one's).
	return killListed(r.dir, pids, r.c.kill)
}

func (r *cgroupRun) release() {
	if r.released {
		return
	}
	r.released = true
	if !r.empty {
		// Never handed to another run: it may hold a process (a failed
		// start, a kill that did not finish).
		r.closeFD()
		_ = rmdirCgroup(r.dir)
		r.c.done(nil)
		return
	}
	if r.c.noFD.Load() {
		r.closeFD()
	}
	r.c.done(&cgroupGroup{dir: r.dir, fd: r.fd})
	r.fd = -1
}

// killCgroup kills every process in the group dir (not its children) and
// waits until it is empty. It returns how many processes it saw.
func killCgroup(dir string, hasKill bool) (int, error) {
	pids, err := cgroupPIDs(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	return killListed(dir, pids, hasKill)
}

// killListed is killCgroup once the group's processes are read (pids).
func killListed(dir string, pids []int, hasKill bool) (int, error) {
	if len(pids) == 0 {
		return 0, nil
	}
	var err error
	seen := len(pids)
	if hasKill {
		// Atomic against forks: the kernel kills the whole group at once.
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
			hasKill = false
		}
	}
	deadline := time.Now().Add(killWait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if !hasKill {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if pids, err = cgroupPIDs(dir); err != nil || len(pids) == 0 {
			return seen, nil
		}
		if time.Now().After(deadline) {
			return seen, fmt.Errorf("sandbox: cgroup %s still holds %d processes %s after SIGKILL", dir, len(pids), killWait)
		}
		time.Sleep(pause)
	}
}

// cgroupPIDs lists the processes in the group dir (exited ones leave at once).
func cgroupPIDs(dir string) ([]int, error) {
	b, err := rawio.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, nil
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// rmdirCgroup removes an empty group. The kernel may report it busy for a
// moment after its last process exited.
func rmdirCgroup(dir string) error {
	var err error
	for range 50 {
		if err = unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// # environment marker

// environContainment marks each process with AGENTFLEET_RUN=<random token>.
// Every descendant inherits it unless it clears its environment on purpose;
// killAll scans /proc for it. Claude Code's tools and shells keep it.
type environContainment struct{}

func (environContainment) mode() string { return ContainEnviron }

func (environContainment) newRun(string, string) (containedRun, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("sandbox: run marker: %w", err)
	}
	return &environRun{marker: runMarkerEnv + "=" + hex.EncodeToString(b)}, nil
}

type environRun struct{ marker string }

func (r *environRun) prepare(cmd *exec.Cmd)  { cmd.Env = append(cmd.Env, r.marker) }
func (r *environRun) startFailed(error) bool { return false }
func (r *environRun) started(int) error      { return nil }
func (r *environRun) release()               {}

// killAll kills every process whose environment holds the marker, pass after
// pass until a pass finds none alive (a process may fork while it is being
// killed; its child carries the marker too).
func (r *environRun) killAll() (int, error) {
	killed := map[int]bool{}
	deadline := time.Now().Add(killWait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		found := r.scan()
		if len(found) == 0 {
			return len(killed), nil
		}
		for _, pid := range found {
			killed[pid] = true
			r.kill(pid)
		}
		if time.Now().After(deadline) {
			return len(killed), fmt.Errorf("sandbox: %d processes of a run still alive %s after SIGKILL", len(found), killWait)
		}
		time.Sleep(pause)
	}
}

// scan returns the pids whose environment holds the marker. A killed
// process's environment reads empty once it has exited (a zombie), so it is
// not found again.
func (r *environRun) scan() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	_ = d.Close()
	var pids []int
	self := os.Getpid()
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		if r.marked(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (r *environRun) marked(pid int) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil || len(env) == 0 {
		return false
	}
	m := []byte(r.marker)
	return bytes.HasPrefix(env, append(m, 0)) || bytes.Contains(env, append(append([]byte{0}, m...), 0))
}

// kill sends SIGKILL through a pidfd checked to still be the marked
// process, so a recycled pid is never hit.
func (r *environRun) kill(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return
	}
	defer func() { _ = unix.Close(fd) }()
	if r.marked(pid) { // the pidfd pins the process the marker was read from
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}
