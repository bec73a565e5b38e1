package fleetcli

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/render"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	_ "github.com/agentfleet/agentfleet/pkg/storage/backends/all" // s3:// and cfkv://
)

// workspaceFlags are submit's --repo, --ref, --depth, --branch and --push.
type workspaceFlags struct {
	fs                *pflag.FlagSet
	repo, ref, branch string
	depth             int
	push              bool
}

func addWorkspaceFlags(fs *pflag.FlagSet) *workspaceFlags {
	w := &workspaceFlags{fs: fs}
	fs.StringVar(&w.repo, "repo", "", "workspace.repo: run the agent in a checkout of this git repository")
	fs.StringVar(&w.ref, "ref", "", "workspace.ref: branch, tag or commit to check out [the remote's HEAD]")
	fs.IntVar(&w.depth, "depth", protocol.DefaultWorkspaceDepth, "workspace.depth: clone depth, 0 = full history")
	fs.StringVar(&w.branch, "branch", "", "workspace.branch: the branch the work ends on [fleet/<tenant>/<id>]")
	fs.BoolVar(&w.push, "push", false, "workspace.push: push that branch to --repo when the run ends")
	return w
}

// apply sets job.Workspace from the flags, or says which flag needs --repo.
func (w *workspaceFlags) apply(job *protocol.Job) error {
	if w.repo == "" {
		for _, name := range []string{"ref", "depth", "branch", "push"} {
			if w.fs.Changed(name) {
				return fmt.Errorf("--%s needs --repo", name)
			}
		}
		return nil
	}
	job.Workspace = &protocol.Workspace{Repo: w.repo, Ref: w.ref, Branch: w.branch, Push: w.push}
	if w.fs.Changed("depth") {
		d := w.depth
		job.Workspace.Depth = &d
	}
	return nil
}

// diffCmd prints a workspace job's stored diff, or its changed files.
type diffCmd struct {
	tenant, storageURL, id string
	stat                   bool
}

func (c *diffCmd) Help() Help {
	return Help{
		Name: "diff", Args: "<id>",
		Summary: "a workspace job's stored diff (--stat: its changed files)",
		Description: `Prints the diff a workspace job (submit --repo) captured, which applies to
its start commit with 'git apply', reading it from the fleet's storage; with
--stat it prints the changed files from the manifest on the query's
.artifact subject instead (no storage needed). A parked workspace session
shows its work as of its last checkpoint, and says so (on stderr for the
diff, which stays applicable). Exit 3 when the query has no workspace
artifact (not a workspace job, or neither ended nor parked yet).`,
		Examples: `dispatcher diff q2 --stat
dispatcher diff q2 --storage file://./data | git apply --index`,
	}
}

func (c *diffCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	fs.BoolVar(&c.stat, "stat", false, "print the changed files (from the manifest) instead of the diff")
	fs.StringVar(&c.storageURL, "storage", "file://./data", "the fleet's storage URL, where the diff is (env FLEET_STORAGE)")
}

func (c *diffCmd) Validate(fs *pflag.FlagSet) error {
	if err := oneID(fs, c.tenant); err != nil {
		return err
	}
	c.id = fs.Arg(0)
	return nil
}

func (c *diffCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	a, err := cl.Artifact(rctx, c.tenant, c.id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		fmt.Fprintf(e.Err, "%s/%s has no workspace artifact (not a workspace job, or neither ended nor parked yet)\n", c.tenant, c.id)
		return ExitNotFound
	}
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if a.Checkpoint {
		fmt.Fprintf(e.Err, "%s/%s: the work as of the last checkpoint (captured when the session parked)\n", c.tenant, c.id)
	}
	if c.stat {
		(&render.Printer{W: e.Out}).Artifact(a)
		return ExitOK
	}
	store, err := backends.Open(rctx, c.storageURL, backends.Objects, backends.Deps{
		JS: cl.JS, StatusBucket: cl.Names.StatusBucket(), ObjectBucket: cl.Names.ObjectBucket(),
	})
	if err != nil {
		fmt.Fprintln(e.Err, err)
		return ExitUnavailable
	}
	defer store.Close()
	diff, err := store.Get(rctx, a.DiffKey)
	if err != nil {
		fmt.Fprintf(e.Err, "reading %s from --storage: %v\n", a.DiffKey, err)
		return ExitUnavailable
	}
	_, _ = e.Out.Write(diff)
	return ExitOK
}
