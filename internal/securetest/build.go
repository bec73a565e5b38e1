package securetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Bins are the built binaries' paths.
type Bins struct {
	Dir, Dispatcher, Worker, Standin, NATSServer string
}

var (
	buildOnce sync.Once
	built     Bins
	buildErr  string
)

// Build builds the binaries once per test process into a directory that
// lives as long as the process (removed by Cleanup).
func Build(t testing.TB) Bins {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "securetest-bin-")
		if err != nil {
			buildErr = err.Error()
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err.Error()
			return
		}
		cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator),
			"./cmd/dispatcher", "./cmd/worker", "./cmd/fleet-standin-agent", "github.com/nats-io/nats-server/v2")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = "go build: " + err.Error() + "\n" + string(out)
			return
		}
		built = Bins{Dir: dir, Dispatcher: filepath.Join(dir, "dispatcher"), Worker: filepath.Join(dir, "worker"),
			Standin: filepath.Join(dir, "fleet-standin-agent"), NATSServer: filepath.Join(dir, "nats-server")}
	})
	if buildErr != "" {
		t.Fatal(buildErr)
	}
	return built
}

// Cleanup removes the built binaries (call it after the tests, from TestMain).
func Cleanup() {
	if built.Dir != "" {
		_ = os.RemoveAll(built.Dir)
	}
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}
