package fleettest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/dispatcher"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// DispatcherFlag makes the test binary a dispatcher process, so a test can
// SIGKILL the admitting dispatcher: argv is [exe, DispatcherFlag, natsURL,
// storageDir, maxConcurrency, leaseTTL]. It prints "ready" once serving and
// "admitting" once it holds the admitter lease.
const DispatcherFlag = "--e2e-dispatcher"

func dispatcherProcess(args []string) int {
	if len(args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: --e2e-dispatcher natsURL storageDir maxConcurrency leaseTTL")
		return 2
	}
	maxConc, err := strconv.Atoi(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ttl, err := time.ParseDuration(args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	nc, err := nats.Connect(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	store, err := storage.NewFS(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d, err := dispatcher.New(dispatcher.Config{
		NC: nc, Status: store, Objects: store,
		Provision: provision.Config{Names: protocol.NewNames(""), MaxConcurrency: maxConc},
		Admission: admission.Config{LeaseTTL: ttl},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = d.Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	for !d.Admitting() {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("admitting")
	select {} // until killed
}

// StartDispatcherProcess starts a dispatcher as a child process (so a
// test can SIGKILL it) and waits until it serves.
func StartDispatcherProcess(t *testing.T, url, sdir string, maxConcurrency int, leaseTTL time.Duration) *ChildProc {
	t.Helper()
	p := startChild(t, "dispatcher", nil, DispatcherFlag, url, sdir, strconv.Itoa(maxConcurrency), leaseTTL.String())
	p.Expect(t, "ready")
	return p
}
