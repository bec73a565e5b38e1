package sandbox

import (
	"os/exec"
	"sync"
)

// hostnameWorks reports whether bwrap can name the sandbox's host
// (`--hostname`: sethostname(2) in the sandbox's UTS namespace). The
// default seccomp profiles of container engines (podman's, Docker's)
// refuse sethostname without CAP_SYS_ADMIN, even inside a new user
// namespace, so a worker in such a container leaves the name out: the
// sandbox keeps a UTS namespace of its own, named as the container.
var hostnameWorks = sync.OnceValue(func() bool {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return false
	}
	cmd := exec.Command(bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--hostname", "agent",
		"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true")
	cmd.Env = []string{}
	return cmd.Run() == nil
})
