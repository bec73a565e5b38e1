package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// setprivPath drops the root-launched sandbox to the agent uid (see
// bwrapArgs).
const setprivPath = "/usr/bin/setpriv"

// CheckContained reports what this machine lacks for IsolationContained:
// bubblewrap, setpriv (util-linux, when the worker is root), user
// namespaces, or a sandbox they can start (a container's seccomp profile or
// an AppArmor userns restriction). nil when it works.
func CheckContained() error {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return fmt.Errorf("isolation contained: bubblewrap (bwrap) is not installed, or not on PATH (Debian: apt-get install bubblewrap): %w", err)
	}
	if os.Geteuid() == 0 {
		if err := unix.Access(setprivPath, unix.X_OK); err != nil {
			return fmt.Errorf("isolation contained: %s (util-linux) is missing: %w", setprivPath, err)
		}
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return errors.New("isolation contained: user namespaces are disabled (sysctl user.max_user_namespaces is 0)")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" && os.Geteuid() != 0 {
		return errors.New("isolation contained: unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone is 0)")
	}
	cmd := exec.Command(bwrap, "--unshare-all", "--unshare-user", "--die-with-parent",
		"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true")
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		said := strings.TrimSpace(string(out))
		return fmt.Errorf("isolation contained: bwrap cannot create namespaces here (user, mount, PID, network): %v: %s%s",
			err, said, bwrapHint(said))
	}
	return nil
}

// bwrapHint says what to change for the failures bwrap reports inside
// containers and on hosts that restrict user namespaces ("" when its
// message is none of them).
func bwrapHint(said string) string {
	switch {
	case strings.Contains(said, "mount proc"):
		return " (the container masks /proc: run it with --security-opt unmask=/proc/* under Podman, " +
			"--security-opt systempaths=unconfined under Docker, securityContext.procMount: Unmasked on Kubernetes; " +
			"and a seccomp profile that allows user namespaces)"
	case strings.Contains(said, "RTM_NEWADDR"), strings.Contains(said, "setting up uid map"):
		return " (an AppArmor restriction of unprivileged user namespaces, as on Ubuntu 24.04: " +
			"give bwrap an AppArmor profile that allows userns, or sysctl kernel.apparmor_restrict_unprivileged_userns=0)"
	case strings.Contains(said, "namespace"):
		return " (the kernel refused user namespaces: a container's seccomp profile (Docker's default blocks them; " +
			"--security-opt seccomp=unconfined or a profile allowing clone/unshare of namespaces), " +
			"or sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)"
	}
	return ""
}

// Descriptors of a bwrap child (ExtraFiles start at 3).
const (
	fdArgs   = 3 // NUL-separated arguments: --args
	fdInfo   = 4 // bwrap writes {"child-pid": N}: --info-fd
	fdUserns = 5 // bwrap waits for the uid map: --userns-block-fd (root only)
	fdBlock  = 6 // bwrap waits before running the program: --block-fd
	fdFilter = 7 // the seccomp program: --seccomp
)

// containedStart is the bwrap launch of one process: its argument memfd,
// the hand-shake pipes, and once started, what the worker serves in the
// process's network namespace.
type containedStart struct {
	s        *localSandbox
	uid      int
	rootMap  bool // the worker is root: it writes the uid map itself
	args     *os.File
	filter   *os.File // nil where there is no seccomp program for this arch
	infoR    *os.File
	infoW    *os.File
	usernsR  *os.File
	usernsW  *os.File
	blockR   *os.File
	blockW   *os.File
	net      *Network
	command  []string // after bwrap's "--"
	inner    int      // host pid of bwrap's PID 1 in the sandbox
	services *netServices
}

// prepareContained builds the bwrap launch of a process.
func (s *localSandbox) prepareContained(spec ProcSpec, path, cwd string, env map[string]string) (*containedStart, error) {
	if err := giveHomeToAgent(s); err != nil {
		return nil, fmt.Errorf("give the agent its HOME: %w", err)
	}
	ct := &containedStart{s: s, uid: s.l.cfg.AgentUID, rootMap: os.Geteuid() == 0, net: spec.Network}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real // bound at its real place; a link to it may not be
	}
	if ct.net == nil {
		ct.net = &Network{}
	}
	if ct.net.Policy.Mode == egress.Allow {
		proxyEnv(env)
	}
	var err error
	if ct.filter, err = seccompFile(); err != nil {
		return nil, err
	}
	argv, err := s.bwrapArgs(ct, spec, path, cwd, env)
	if err != nil {
		ct.close()
		return nil, err
	}
	ct.command = ct.commandArgs(spec, path)
	if ct.args, err = memfdWith(strings.Join(argv, "\x00") + "\x00"); err != nil {
		ct.close()
		return nil, err
	}
	if ct.infoR, ct.infoW, err = os.Pipe(); err != nil {
		ct.close()
		return nil, err
	}
	if ct.usernsR, ct.usernsW, err = os.Pipe(); err != nil {
		ct.close()
		return nil, err
	}
	if ct.blockR, ct.blockW, err = os.Pipe(); err != nil {
		ct.close()
		return nil, err
	}
	return ct, nil
}

func memfdWith(data string) (*os.File, error) {
	fd, err := unix.MemfdCreate("bwrap-args", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "bwrap-args")
	if _, err := f.WriteString(data); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// cmd returns the bwrap command: its options, the agent's environment
// among them, come from the argument descriptor and its own environment is
// empty, so bwrap's processes (PID 1 in the sandbox among them) show
// neither the agent's environment nor the worker's.
func (ct *containedStart) cmd(pp *procPipes) *exec.Cmd {
	_, _ = ct.args.Seek(0, 0)
	files := []*os.File{ct.args, ct.infoW, ct.usernsR, ct.blockR}
	if ct.filter != nil {
		_, _ = ct.filter.Seek(0, 0)
		files = append(files, ct.filter)
	}
	cmd := &exec.Cmd{
		Path:        ct.s.l.bwrap,
		Args:        append([]string{"bwrap", "--args", strconv.Itoa(fdArgs), "--"}, ct.command...),
		Env:         []string{},
		Dir:         "/",
		Stdout:      pp.stdoutW,
		Stderr:      pp.stderrW,
		ExtraFiles:  files,
		SysProcAttr: sysProcAttr(),
	}
	if pp.stdinR != nil {
		cmd.Stdin = pp.stdinR
	}
	return cmd
}

// closeChildEnds closes what only bwrap needs, once it has them.
func (ct *containedStart) closeChildEnds() {
	closeFiles(ct.args, ct.filter, ct.infoW, ct.usernsR, ct.blockR)
	ct.args, ct.filter, ct.infoW, ct.usernsR, ct.blockR = nil, nil, nil, nil, nil
}

// close closes every descriptor still open. A nil ct is fine.
func (ct *containedStart) close() {
	if ct == nil {
		return
	}
	ct.closeChildEnds()
	closeFiles(ct.infoR, ct.usernsW, ct.blockW)
	ct.infoR, ct.usernsW, ct.blockW = nil, nil, nil
}

// handshake runs once bwrap has started: it learns the sandbox's PID 1,
// maps the agent uid (root), opens the forwards and the proxy inside the
// sandbox's network namespace, and lets the program run.
func (ct *containedStart) handshake() error {
	defer ct.close()
	ct.closeChildEnds()
	_ = ct.infoR.SetReadDeadline(time.Now().Add(30 * time.Second))
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	if err := json.NewDecoder(ct.infoR).Decode(&info); err != nil || info.ChildPid <= 0 {
		return fmt.Errorf("bwrap did not report its sandbox (its stderr says why): %v", err)
	}
	ct.inner = info.ChildPid
	if ct.rootMap {
		// Root outside is root of the namespace (bwrap's set-up, then
		// dropped by setpriv); the agent uid is itself on both sides, so
		// what it writes is its own on the host.
		m := fmt.Sprintf("0 0 1\n%d %d 1\n", ct.uid, ct.uid)
		for _, f := range []string{"uid_map", "gid_map"} {
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", ct.inner, f), []byte(m), 0); err != nil {
				return fmt.Errorf("map the agent uid: %w", err)
			}
		}
		if _, err := ct.usernsW.Write([]byte{1}); err != nil {
			return fmt.Errorf("release bwrap: %w", err)
		}
	}
	if ct.net.Policy.Mode != egress.Open {
		svc, err := serveNetwork(ct.inner, ct.net, ct.s.log)
		if err != nil {
			return err
		}
		ct.services = svc
	}
	if _, err := ct.blockW.Write([]byte{1}); err != nil {
		ct.stop()
		return fmt.Errorf("release bwrap: %w", err)
	}
	return nil
}

// stop ends what the worker serves for the process. A nil ct is fine.
func (ct *containedStart) stop() {
	if ct != nil && ct.services != nil {
		ct.services.close()
	}
}

// signalAgent sends sig to the program bwrap runs (the only child of the
// sandbox's PID 1) and its process group when it has one of its own; false
// if the program is gone.
func (ct *containedStart) signalAgent(sig syscall.Signal) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", ct.inner, ct.inner))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return false
	}
	pg, err := unix.Getpgid(pid)
	if ipg, _ := unix.Getpgid(ct.inner); err == nil && pg != ipg {
		_ = unix.Kill(-pg, sig)
	}
	return unix.Kill(pid, sig) == nil
}

// bwrapArgs are bwrap's arguments for one process (passed through --args,
// never on its command line).
func (s *localSandbox) bwrapArgs(ct *containedStart, spec ProcSpec, path, cwd string, env map[string]string) ([]string, error) {
	a := []string{"--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
		"--info-fd", strconv.Itoa(fdInfo), "--block-fd", strconv.Itoa(fdBlock)}
	if hostnameWorks() {
		a = append(a, "--hostname", "agent")
	}
	uid := strconv.Itoa(ct.uid)
	if ct.rootMap {
		a = append(a, "--userns-block-fd", strconv.Itoa(fdUserns))
	} else {
		a = append(a, "--uid", uid, "--gid", uid, "--cap-drop", "ALL", "--disable-userns")
	}
	if ct.filter != nil {
		a = append(a, "--seccomp", strconv.Itoa(fdFilter))
	}
	open := ct.net.Policy.Mode == egress.Open
	if open {
		a = append(a, "--share-net")
	}
	a = append(a, systemBinds()...)
	etc := s.l.etcDir
	a = append(a, "--ro-bind", filepath.Join(etc, "passwd"), "/etc/passwd", "--ro-bind", filepath.Join(etc, "group"), "/etc/group")
	if open {
		a = append(a, "--ro-bind-try", "/etc/hosts", "/etc/hosts", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf")
	} else {
		a = append(a, "--ro-bind", filepath.Join(etc, "hosts"), "/etc/hosts")
	}
	a = append(a, "--proc", "/proc", "--dev", "/dev")
	a = append(a, scratchMounts(s.l.cfg.TmpBytes)...)

	ro := []string{}
	if b := programBind(path, s.l.hidden, s.work); b != "" {
		ro = append(ro, b)
	}
	ro = append(ro, s.l.cfg.ReadOnlyPaths...)
	rw := []string{s.work, s.home, s.tmp}
	made := map[string]bool{"/": true, "/tmp": true, "/var": true, "/var/tmp": true}
	for _, d := range append(append([]string{}, ro...), rw...) {
		a = append(a, parentDirs(d, made)...)
	}
	for _, d := range ro {
		a = append(a, "--ro-bind", d, d)
	}
	for _, d := range rw {
		a = append(a, "--bind", d, d)
	}
	a = append(a, "--chdir", cwd, "--remount-ro", "/", "--clearenv")
	for _, kv := range envList(env) {
		k, v, _ := strings.Cut(kv, "=")
		a = append(a, "--setenv", k, v)
	}
	return a, nil
}

// scratchMounts are a contained sandbox's private /tmp and /var/tmp: each
// a fresh tmpfs of at most size bytes, mode 1777 like a host's, so the
// agent uid (and anything else inside) writes and runs files there; none
// of the host's /tmp or /var/tmp is visible, and both vanish with the
// process. /var itself is an empty read-only directory.
func scratchMounts(size int64) []string {
	n := strconv.FormatInt(size, 10)
	return []string{"--perms", "1777", "--size", n, "--tmpfs", "/tmp",
		"--perms", "0755", "--dir", "/var",
		"--perms", "1777", "--size", n, "--tmpfs", "/var/tmp"}
}

// commandArgs is what bwrap runs, on its command line (bwrap takes the
// command only from there): the program and its arguments, behind setpriv
// when the worker is root. No environment value is among them.
func (ct *containedStart) commandArgs(spec ProcSpec, path string) []string {
	var a []string
	if ct.rootMap {
		uid := strconv.Itoa(ct.uid)
		a = append(a, setprivPath, "--reuid", uid, "--regid", uid, "--clear-groups",
			"--inh-caps=-all", "--bounding-set=-all", "--")
	}
	a = append(a, path)
	return append(a, spec.Argv[1:]...)
}

// systemBinds binds the system's directories read-only: /usr and the
// merged-/usr links (or directories), and what of /etc programs need to run
// and verify TLS.
func systemBinds() []string {
	a := []string{"--ro-bind", "/usr", "/usr"}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"} {
		if t, err := os.Readlink(d); err == nil {
			a = append(a, "--symlink", t, d)
		} else {
			a = append(a, "--ro-bind-try", d, d)
		}
	}
	// /etc first, 0755: made implicitly by the binds below, a root
	// worker's bwrap would leave it 0700 root's, and the agent's uid could
	// read none of it (certificates, passwd, the system git config).
	a = append(a, "--perms", "0755", "--dir", "/etc")
	for _, f := range []string{"/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/alternatives",
		"/etc/localtime", "/etc/nsswitch.conf", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
		"/etc/gitconfig", "/etc/mime.types", "/etc/claude-code"} {
		a = append(a, "--ro-bind-try", f, f)
	}
	return a
}

// parentDirs makes the directories above d that are not made yet, 0755 so
// the agent uid can walk to its binds (bwrap's own are 0700).
func parentDirs(d string, made map[string]bool) []string {
	var out []string
	var chain []string
	for p := filepath.Dir(d); !made[p] && p != "/"; p = filepath.Dir(p) {
		chain = append(chain, p)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if under(chain[i], "/usr") {
			continue
		}
		made[chain[i]] = true
		out = append(out, "--perms", "0755", "--dir", chain[i])
	}
	return out
}

// writeEtc writes the /etc files every contained sandbox of l sees.
func writeEtc(dir string, uid int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"passwd": fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\nagent:x:%d:%d:agent:/nonexistent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, uid),
		"group":  fmt.Sprintf("root:x:0:\nagent:x:%d:\nnogroup:x:65534:\n", uid),
		"hosts":  "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// initContained checks the machine and prepares what every contained
// sandbox shares.
func (l *Local) initContained() error {
	if err := CheckContained(); err != nil {
		return err
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return err
	}
	l.etcDir = filepath.Join(l.root, ".etc")
	if err := writeEtc(l.etcDir, l.cfg.AgentUID); err != nil {
		return fmt.Errorf("isolation contained: %w", err)
	}
	l.bwrap = bwrap
	return nil
}

// ownTree gives the agent uid the directories a contained agent writes
// (when the worker is root; otherwise they are the worker's, which the
// agent uid maps to).
func ownTree(s *localSandbox) error {
	if !s.l.Contained() || os.Geteuid() != 0 {
		return nil
	}
	uid := s.l.cfg.AgentUID
	for _, d := range []string{s.work, s.home, s.claudeDir, s.tmp} {
		if err := os.Chown(d, uid, uid); err != nil {
			return err
		}
	}
	return nil
}

// applyLimits writes the process's cgroup v2 limits into its run's group
// (contained processes only). A limit whose controller this machine's
// hierarchy does not offer is logged once and not enforced.
func applyLimits(run containedRun, cfg LocalConfig, asked Limits, contained bool) error {
	if !contained {
		return nil
	}
	lim, err := asked.resolve(cfg.DefaultLimits, cfg.MaxLimits)
	if err != nil {
		return err
	}
	cg, ok := run.(*cgroupRun)
	if !ok {
		if lim != (Limits{}) {
			limitsWarn.Do(func() {
				cfg.Logger.Warn().Msg("cgroup limits are not enforced: processes are not contained by cgroup here")
			})
		}
		return nil
	}
	for _, w := range []struct {
		file string
		val  int64
	}{{"memory.max", lim.MemoryBytes}, {"pids.max", int64(lim.Pids)}, {"cpu.weight", int64(lim.CPUWeight)}} {
		v := "max"
		if w.file == "cpu.weight" {
			v = "100"
		}
		if w.val > 0 {
			v = strconv.FormatInt(w.val, 10)
		}
		err := writeExisting(filepath.Join(cg.dir, w.file), v)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if w.val > 0 {
				limitsWarn.Do(func() {
					cfg.Logger.Warn().Str("file", w.file).
						Msg("cgroup limits are not enforced: the controller is not enabled for the worker's cgroup")
				})
			}
		case err != nil:
			return fmt.Errorf("set %s: %w", w.file, err)
		}
	}
	return nil
}

var limitsWarn sync.Once

// writeExisting writes v to a file that must exist (a cgroup interface
// file: never created).
func writeExisting(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// agentOwner is the uid that must own what the worker writes into a
// contained sandbox for its agent to change it, or -1 when nothing needs
// changing (not contained, or a non-root worker whose uid the agent maps
// to).
func agentOwner(s *localSandbox) int {
	if !s.l.Contained() || os.Geteuid() != 0 {
		return -1
	}
	return s.l.cfg.AgentUID
}

// giveToAgent hands a file the worker wrote into the workspace, and the
// directories above it, to the agent uid.
func giveToAgent(s *localSandbox, name string) error {
	uid := agentOwner(s)
	if uid < 0 {
		return nil
	}
	for p := name; p != "." && p != "/"; p = filepath.Dir(p) {
		if err := s.root.Lchown(p, uid, uid); err != nil {
			return err
		}
	}
	return nil
}

// giveHomeToAgent hands the agent what the worker wrote into its HOME since
// the last process (session transcripts written through HostConfigDir),
// before a contained process starts.
func giveHomeToAgent(s *localSandbox) error {
	uid := agentOwner(s)
	if uid < 0 {
		return nil
	}
	return filepath.WalkDir(s.home, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != uid || int(st.Gid) != uid) {
			return os.Lchown(p, uid, uid)
		}
		return nil
	})
}

// broadDirs hold more than one program's install tree: a program found
// directly in one of them is bound alone, not with its directory.
var broadDirs = map[string]bool{"/": true, "/tmp": true, "/var/tmp": true, "/root": true, "/home": true,
	"/var": true, "/opt": true, "/srv": true, "/mnt": true, "/media": true, "/run": true, "/dev/shm": true, "/etc": true}

// programBind is what of the program at path (symlinks resolved) a
// contained sandbox gets read-only: its directory (the install tree of a
// self-contained binary), or the file alone when the directory is a broad
// one or holds one of the hidden paths (the sandboxes' root, the worker's
// credentials and data); "" for a program under /usr or in the workspace,
// which are there anyway.
func programBind(path string, hidden []string, work string) string {
	dir := filepath.Dir(path)
	switch {
	case under(dir, "/usr") || under(path, work):
		return ""
	case broadDirs[dir] || slices.ContainsFunc(hidden, func(h string) bool { return under(h, dir) }):
		return path
	}
	return dir
}
