package fleetcli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
)

// versionCmd prints the build's version.
type versionCmd struct{ asJSON bool }

func (c *versionCmd) Help() Help {
	return Help{
		Name: "version", Summary: "print this build's version (no NATS needed)",
		Examples: "dispatcher version\ndispatcher version --json",
	}
}

func (c *versionCmd) Flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.asJSON, "json", false, "print version, revision and Go version as JSON")
}

func (c *versionCmd) Validate(fs *pflag.FlagSet) error {
	if fs.NArg() != 0 {
		return fmt.Errorf("version takes no arguments")
	}
	return nil
}

func (c *versionCmd) Run(_ context.Context, e *Env) int {
	if c.asJSON {
		b, _ := json.Marshal(buildinfo.Get())
		fmt.Fprintln(e.Out, string(b))
		return ExitOK
	}
	i := buildinfo.Get()
	fmt.Fprintf(e.Out, "agentfleet %s (%s)\n", buildinfo.Version(), i.GoVersion)
	return ExitOK
}
