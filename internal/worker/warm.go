package worker

// Warm agents (docs/warm.md, package warm): the worker owns a pool of agents
// started ahead, per option profile, each in a sandbox of its own and
// waiting in stream-json input mode. A job whose profile matches takes
// one before its sandbox would be made, and the warm agent's sandbox
// becomes the run's: a one-shot job writes its prompt as the first user
// message and closes the input (warm.Agent.Begin), then the runner reads
// the agent to its result (agent.Runner.Adopt); a session adopts the
// process (session.Adopt) and its first turn writes the prompt. Every
// other job starts cold, as before. "running" says which ("warm":
// true|false, query.event).

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// newWarmPool is the worker's pool of warm agents, nil when Config.Warm
// is 0. It keeps the profile of an option-less job on the default sandbox
// warm from the start; others as jobs ask for them.
func newWarmPool(w *Worker) (*warm.Pool, error) {
	if w.cfg.Warm == 0 {
		return nil, nil
	}
	plain, _ := warm.ProfileOf(&protocol.Job{}, warm.Placement{Sandbox: w.cfg.DefaultSandbox})
	log := w.log.With().Str("component", "warm").Logger()
	pool, err := warm.New(warm.Config{
		N: w.cfg.Warm, Spawn: w.spawnWarm, Handshake: true,
		Profiles: []warm.Profile{plain}, Logger: &log,
	})
	if err == nil && w.cfg.Test.WarmEvents != nil {
		w.cfg.Test.WarmEvents(pool.Events())
	}
	return pool, err
}

// warmProcess is a warm agent's process with the sandbox it runs in, and
// its model gateway token (minted unbound at spawn; bound to the run by
// meteredMode at take), "" without a gateway.
type warmProcess struct {
	sandbox.InteractiveProcess
	sb    sandbox.Sandbox
	token string
}

// spawnWarm starts one agent of profile p in a new sandbox of p's
// provider: the argv of a cold session of the same options, the
// environment the job's options.env adds (through the operator's
// allow-list, as for a cold run); nothing of a run.
func (w *Worker) spawnWarm(ctx context.Context, p warm.Profile) (warm.Spawned, error) {
	provider := w.cfg.Providers[p.Sandbox]
	if provider == nil {
		return warm.Spawned{}, fmt.Errorf("no sandbox provider %q on this worker", p.Sandbox)
	}
	env := p.EnvMap()
	for k := range env {
		if !slices.Contains(w.cfg.EnvAllow, k) {
			return warm.Spawned{}, fmt.Errorf("options.env.%s is not in the operator's allow-list", k)
		}
	}
	var token string
	if gw := w.cfg.Gateway; gw != nil && p.Sandbox == protocol.SandboxLocal {
		// As meteredMode gives a cold agent, with a token of no run yet.
		var url string
		token, url = gw.OpenUnbound()
		if env == nil {
			env = map[string]string{}
		}
		env[envBaseURL], env[envAPIKey], env[envNonessential] = url, token, "1"
	}
	revoke := func() {
		if token != "" {
			w.cfg.Gateway.Revoke(token)
		}
	}
	spec := w.warmNetwork(provider, sandbox.Spec{ID: "warm-" + randomHex(8)}, env)
	sb, err := provider.Create(ctx, spec)
	if err != nil {
		revoke()
		return warm.Spawned{}, err
	}
	release := func(ctx context.Context) error { revoke(); return sb.Destroy(ctx) }
	isb, ok := sb.(sandbox.Interactive)
	if !ok {
		_ = release(ctx)
		return warm.Spawned{}, fmt.Errorf("sandbox provider %q cannot start interactive processes", p.Sandbox)
	}
	proc, err := isb.StartInteractive(ctx, sandbox.ProcSpec{ID: "agent", Argv: p.Argv(w.cfg.Runner.Command()), Env: env})
	if err != nil {
		_ = release(context.WithoutCancel(ctx))
		return warm.Spawned{}, err
	}
	return warm.Spawned{Process: &warmProcess{InteractiveProcess: proc, sb: sb, token: token}, Release: release}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// takeWarm takes a warm agent for q's job, when the worker keeps them and
// the job may use one (its profile matches; resumes, a session's later
// attempt, workspaces and setups start cold).
func (q *query) takeWarm() *warm.Agent {
	pool := q.w.warm
	if pool == nil || q.job.Session != nil && q.attempt > 1 {
		// A session's later attempt may restore its checkpoint.
		return nil
	}
	if p, err := q.w.jobNetwork(q.job); err != nil || p.String() != q.w.cfg.Network.Default.String() || q.job.Limits != nil {
		// Warm agents are spawned with the worker's default network and
		// limits.
		q.log.Debug().Msg("starting cold: the job's network or limits are not the warm agents'")
		return nil
	}
	p, cold := warm.ProfileOf(q.job, warm.Placement{Sandbox: cmp.Or(q.job.Sandbox, q.w.cfg.DefaultSandbox)})
	if cold != "" {
		q.log.Debug().Str("why", cold).Msg("starting cold")
		return nil
	}
	a, ok := pool.Take(p)
	if !ok {
		return nil
	}
	if _, ok := a.Process().(*warmProcess); !ok {
		_ = a.Close(context.Background())
		return nil
	}
	return a
}

// newRunBox is the attempt's sandbox: a warm agent's when q took one,
// else one made now (newBox).
func (q *query) newRunBox(provider sandbox.Provider, spec sandbox.Spec) *box {
	if q.warm = q.takeWarm(); q.warm == nil {
		return newBox(q.runCtx, q.w, q.log, provider, spec)
	}
	a := q.warm
	sb := a.Process().(*warmProcess).sb
	q.log.Info().Str("sandbox", sb.ID()).Dur("warm_for", time.Since(a.Spawned())).Msg("took a warm agent")
	return &box{cleanup: &q.w.cleanup, log: q.log,
		wait:  func() (sandbox.Sandbox, error) { return sb, nil },
		close: a.Close}
}

// runAgent runs the one-shot agent of req: the warm agent q took, given
// the prompt as its first message, else a cold start. A warm agent that
// cannot begin (it died since) is stopped and the run starts its agent
// cold in the same sandbox.
func (o *oneShot) runAgent(ctx context.Context, req agent.Request, emit agent.EmitFunc) (agent.Outcome, error) {
	q := o.q
	a := q.warm
	if a == nil {
		return q.w.cfg.Runner.Run(ctx, req, emit)
	}
	wp := a.Process().(*warmProcess)
	err := a.Begin(ctx, warm.Run{Tenant: q.job.Tenant, ID: q.job.ID}, req.Job.Prompt, true)
	if err == nil {
		return q.w.cfg.Runner.Adopt(ctx, req, adopted{wp, a.Stdout()}, emit)
	}
	q.log.Warn().Err(err).Msg("the warm agent could not begin; starting the agent cold in its sandbox")
	if serr := wp.Stop(context.WithoutCancel(ctx), time.Second); serr != nil && !errors.Is(serr, sandbox.ErrExited) {
		q.log.Warn().Err(serr).Msg("stopping the warm agent")
	}
	return q.w.cfg.Runner.Run(ctx, req, emit)
}

// adoptWarm makes the first process of a session the warm agent q took:
// bound to the run, its first message written by the session's first
// turn. ok false: start one (no warm agent, a later process, a resumed
// session, or the warm agent could not be bound, which is stopped).
func (r *sessionRun) adoptWarm(ctx context.Context, spec session.Spec, emit agent.EmitFunc) (*session.Session, bool) {
	q := r.q
	a := q.warm
	if a == nil || r.procs > 1 {
		return nil, false
	}
	wp := a.Process().(*warmProcess)
	err := errors.New("the session resumes " + spec.Resume)
	if spec.Resume == "" {
		err = a.Bind(ctx, warm.Run{Tenant: q.job.Tenant, ID: q.job.ID})
	}
	var s *session.Session
	if err == nil {
		s, err = session.Adopt(q.w.cfg.Sessions, spec, adopted{wp, a.Stdout()}, emit)
	}
	if err == nil {
		return s, true
	}
	r.log.Warn().Err(err).Msg("not using the warm agent; starting the session's agent cold in its sandbox")
	if serr := wp.Stop(context.WithoutCancel(ctx), time.Second); serr != nil && !errors.Is(serr, sandbox.ErrExited) {
		r.log.Warn().Err(serr).Msg("stopping the warm agent")
	}
	return nil, false
}

// warmToken is the gateway token of the warm agent q took, "" when it
// took none or the agent has no token.
func (q *query) warmToken() string {
	if q.warm == nil {
		return ""
	}
	return q.warm.Process().(*warmProcess).token
}

// adopted is a warm agent's process as the runner reads it: its output
// from what the pool's handshake left.
type adopted struct {
	*warmProcess
	out io.Reader
}

func (a adopted) ID() string        { return "agent" }
func (a adopted) Stdout() io.Reader { return a.out }

// warmNetwork gives a warm agent's sandbox the worker's default network
// (the only one warm agents are taken for, see takeWarm), with the model
// forward, and points env's ANTHROPIC_BASE_URL (the gateway's, when set)
// at the forward when the sandbox is contained.
func (w *Worker) warmNetwork(provider sandbox.Provider, spec sandbox.Spec, env map[string]string) sandbox.Spec {
	n := &sandbox.Network{Policy: w.cfg.Network.Default, Deny: w.cfg.Network.Deny}
	spec.Network = n
	model := cmp.Or(env[envBaseURL], w.cfg.Network.ModelURL)
	if model == "" {
		return spec
	}
	cp, ok := provider.(containedProvider)
	base, err := agentBaseURL(model, n, ok && cp.Contained())
	if err != nil {
		return spec // as a cold agent: it keeps the URL it has
	}
	if env[envBaseURL] != "" {
		env[envBaseURL] = base
	} else {
		spec.Env = map[string]string{envBaseURL: base} // as withNetwork does for a cold agent
	}
	return spec
}
