package bridgefake

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// markerEnv names the environment variable that marks every process of a
// fake sandbox with the sandbox's marker.
const markerEnv = "FLEET_BRIDGEFAKE_SANDBOX"

func newMarker() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// killMarked kills every process of this machine whose environment holds
// marker, until none is left (a few rounds: a process may fork while the
// scan runs). The process groups the fake started are killed before; this
// finds what left them, such as a tool the agent started with setsid.
func killMarked(marker string) {
	entry := []byte(markerEnv + "=" + marker + "\x00")
	for range 5 {
		found := false
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			pid, err := strconv.Atoi(filepath.Base(d))
			if err != nil || pid == os.Getpid() {
				continue
			}
			env, err := os.ReadFile(filepath.Join(d, "environ"))
			if err != nil || !bytes.Contains(append([]byte{0}, env...), append([]byte{0}, entry...)) {
				continue
			}
			found = true
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !found {
			return
		}
	}
}
