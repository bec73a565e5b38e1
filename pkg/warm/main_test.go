package warm_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/standin"
)

// childFlag makes the test binary the stand-in agent (nomad's testtask
// pattern): argv is [test binary, childFlag, <the agent's flags>…].
const childFlag = "--warm-test-standin"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == childFlag {
		os.Exit(standin.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}
