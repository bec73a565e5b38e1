package fleetcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

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

// Artifact returns the workspace manifest of a query, read from the
// query's .artifact subject (kept by FLEET_QUERIES). It wraps
// jetstream.ErrMsgNotFound when the query has none (yet).
func (c *Client) Artifact(ctx context.Context, tenant, id string) (protocol.Artifact, error) {
	st, err := c.JS.Stream(ctx, c.Names.QueriesStream())
	if err != nil {
		return protocol.Artifact{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, c.Names.QueryArtifact(tenant, id))
	if err != nil {
		return protocol.Artifact{}, err
	}
	var a protocol.Artifact
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return protocol.Artifact{}, fmt.Errorf("fleet: artifact of %s/%s: %w", tenant, id, err)
	}
	return a, nil
}

// runDiff is `dispatcher diff <id> [--stat]`: the file list from the
// manifest, or the stored diff itself from storage.
func runDiff(ctx context.Context, c *Client, tenant, id string, stat bool, storageURL string, p interface{ Artifact(protocol.Artifact) }, stdio IO) int {
	a, err := c.Artifact(ctx, tenant, id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		fmt.Fprintf(stdio.Err, "%s/%s has no workspace artifact (not a workspace job, or not ended yet)\n", tenant, id)
		return ExitNotFound
	}
	if err != nil {
		fmt.Fprintln(stdio.Err, err)
		return ExitUnavailable
	}
	if stat {
		p.Artifact(a)
		return ExitOK
	}
	store, err := backends.Open(ctx, storageURL, backends.Objects, backends.Deps{
		JS: c.JS, StatusBucket: c.Names.StatusBucket(), ObjectBucket: c.Names.ObjectBucket(),
	})
	if err != nil {
		fmt.Fprintln(stdio.Err, err)
		return ExitUnavailable
	}
	defer store.Close()
	diff, err := store.Get(ctx, a.DiffKey)
	if err != nil {
		fmt.Fprintf(stdio.Err, "reading %s from --storage: %v\n", a.DiffKey, err)
		return ExitUnavailable
	}
	_, _ = stdio.Out.Write(diff)
	return ExitOK
}
