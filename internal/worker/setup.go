package worker

// Setup environments (docs/warm.md, package envcache): a job's setup script
// runs in its checkout after the checkout and before the agent, its
// output published on .setup line by line; what it leaves is saved in the
// worker's environment cache and restored for later jobs of the same
// repository, script and inputs instead of running it again.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// setupTail is how much of a failed setup's output its error message keeps.
const setupTail = 2 << 10

// setupMode runs the job's setup before the mode it wraps (inside a
// workspace's, so after the checkout).
type setupMode struct {
	mode
	q *query
	// failed: the setup failed; the run ended without its agent.
	failed bool
}

func (m *setupMode) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (agent.Outcome, error) {
	if _, failed := sb.(failedSandbox); failed {
		return m.mode.run(ctx, sb, emit)
	}
	if msg, err := m.setup(ctx, sb); err != nil {
		if errors.Is(context.Cause(ctx), agent.ErrHandback) {
			return agent.Outcome{HandedBack: true}, nil
		}
		if errors.Is(context.Cause(ctx), agent.ErrCancelled) {
			return syntheticEnd(emit, protocol.ReasonCancelled, "worker: the query was cancelled during its setup")
		}
		var se *envcache.SetupError
		if !errors.As(err, &se) && sandbox.Retryable(err) {
			return agent.Outcome{}, fmt.Errorf("running the setup: %w", err)
		}
		m.failed = true
		m.q.log.Warn().Err(err).Msg("the setup failed; the agent does not start")
		return syntheticEnd(emit, protocol.CodeSetup, msg)
	}
	return m.mode.run(ctx, sb, emit)
}

// finish gives a failed setup its own code.
func (m *setupMode) finish(ctx context.Context, ev protocol.StatusEvent) protocol.StatusEvent {
	ev = m.mode.finish(ctx, ev)
	if m.failed && ev.Error != nil {
		ev.Error.Code = protocol.CodeSetup
	}
	return ev
}

// setup restores the job's environment from the cache or runs its setup
// (and saves what it left). A failure returns the message for the user:
// the setup's error and the tail of its output.
func (m *setupMode) setup(ctx context.Context, sb sandbox.Sandbox) (string, error) {
	q := m.q
	job := q.job
	if job.Options.TimeoutS != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, time.Duration(*job.Options.TimeoutS)*time.Second, agent.ErrTimeout)
		defer cancel()
	}
	cache, key, workdir := m.cacheKey(sb)
	if cache != nil {
		res, err := cache.Restore(ctx, key, workdir)
		switch {
		case err == nil && res.Hit:
			if err := giveToAgent(workdir); err != nil {
				q.log.Warn().Err(err).Msg("handing the restored setup environment to the agent; running the setup")
			} else {
				q.log.Info().Int("files", res.Files).Int64("bytes", res.Bytes).Int("cloned", res.Cloned).Bool("prepared", res.Prepared).
					Msg("setup environment restored from the cache")
				return "", nil
			}
		case err != nil:
			q.log.Warn().Err(err).Msg("the setup environment could not be restored; running the setup")
		}
	}
	var before envcache.Snapshot
	if cache != nil {
		var err error
		if before, err = envcache.TakeSnapshot(ctx, sb); err != nil {
			q.log.Warn().Err(err).Msg("setup environment not cached: the checkout's state before the setup is unknown")
			cache = nil
		}
	}
	out := &tailLines{q: q, subject: q.w.names.QuerySetup(job.Tenant, job.ID)}
	if err := envcache.RunSetup(ctx, sb, "", job.Setup, out.line); err != nil {
		msg := "worker: " + err.Error()
		if t := out.tail(); t != "" {
			msg += "; its output ended with:\n" + t
		}
		return msg, err
	}
	q.log.Info().Int("lines", out.n).Msg("setup done")
	if cache != nil {
		m.save(ctx, sb, cache, key, workdir, before, out)
	}
	return "", nil
}

// cacheKey is the job's environment cache and key, nil when the setup
// runs without the cache (no cache, no repository, a sandbox whose
// checkout is not on this machine, inputs that cannot be read).
func (m *setupMode) cacheKey(sb sandbox.Sandbox) (*envcache.Cache, string, string) {
	q := m.q
	cache := q.w.cfg.EnvCache
	hd, ok := sb.(sandbox.HostWorkDir)
	if cache == nil || !ok || q.job.Workspace == nil {
		return nil, "", ""
	}
	key, err := envcache.Key(q.job.Workspace.Repo, q.job.Setup, hd.HostWorkDir())
	if err != nil {
		q.log.Warn().Err(err).Msg("setup environment not cached: its key cannot be made")
		return nil, "", ""
	}
	return cache, key, hd.HostWorkDir()
}

// save stores what the setup left in the checkout. A failure is logged
// and said (a last line on .setup, marked [fleet]): the job ran its setup
// cold, nothing fails for the cache.
func (m *setupMode) save(ctx context.Context, sb sandbox.Sandbox, cache *envcache.Cache, key, workdir string, before envcache.Snapshot, out *tailLines) {
	q := m.q
	after, err := envcache.TakeSnapshot(ctx, sb)
	var res envcache.Result
	if err == nil {
		res, err = cache.Save(ctx, key, workdir, envcache.Changed(before, after))
	}
	if err != nil {
		q.log.Warn().Err(err).Msg("setup environment not cached")
		out.publish("[fleet] setup environment not cached: " + err.Error())
		return
	}
	q.log.Info().Int("files", res.Files).Int64("bytes", res.Bytes).Msg("setup environment cached")
}

// tailLines publishes each setup line on .setup and keeps the last ones.
type tailLines struct {
	q       *query
	subject string
	n       int
	last    []string
	size    int
	pubErr  bool
}

func (t *tailLines) line(s string) {
	t.n++
	t.last = append(t.last, s)
	t.size += len(s) + 1
	for t.size > setupTail && len(t.last) > 1 {
		t.size -= len(t.last[0]) + 1
		t.last = t.last[1:]
	}
	t.publish(s)
}

// publish publishes one line on .setup.
func (t *tailLines) publish(s string) {
	msg := nats.NewMsg(t.subject)
	msg.Data = []byte(s)
	msg.Header.Set(protocol.HeaderAttempt, strconv.Itoa(t.q.attempt))
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if _, err := t.q.w.js.PublishMsg(ctx, msg); err != nil && !t.pubErr {
		t.pubErr = true
		t.q.log.Warn().Err(err).Msg("publishing the setup's output")
	}
}

func (t *tailLines) tail() string {
	s := strings.Join(t.last, "\n")
	if len(s) > setupTail {
		s = s[len(s)-setupTail:]
	}
	return s
}

// giveToAgent hands what the worker restored into a checkout to the
// owner of the checkout's directory: a contained sandbox's agent runs as
// another uid (package sandbox gives it its directories, and chowns what
// its WriteFile writes; this follows its lead). Nothing changes when the
// worker is not root or the directory is the worker's.
func giveToAgent(workdir string) error { return workspace.ChownLike(workdir, workdir) }

// logRepoCache says how the repository cache served a checkout (docs/warm.md);
// "running" carries the same (workspace.cache, workspace.cache_cold). A
// cache that could not serve it is said: the job ran cold.
func logRepoCache(q *query, base workspace.Base) {
	switch base.Cache {
	case "":
	case workspace.CacheCold:
		q.log.Warn().Str("repo_cache", base.Cache).Str("why", base.CacheCold).Msg("the repository cache could not serve the checkout; it was fetched cold")
	default:
		q.log.Info().Str("repo_cache", base.Cache).Msg("checkout made through the repository cache")
	}
}
