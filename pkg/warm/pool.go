package warm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/startstop"
)

// Defaults of Config.
const (
	DefaultMaxProfiles  = 8
	DefaultSpawnTimeout = 2 * time.Minute
	DefaultStopGrace    = 5 * time.Second
	DefaultRefillDelay  = time.Second
	maxBackoff          = time.Minute
)

// Config configures a Pool.
type Config struct {
	// N is how many agents to keep ready per profile (--warm N). Required,
	// at least 1.
	N int
	// Spawn starts one agent. Required.
	Spawn SpawnFunc
	// Profiles are kept warm from Start on. Take adds every profile it is
	// asked for, up to MaxProfiles (the least recently asked for makes
	// room: its agents are stopped).
	Profiles []Profile
	// MaxProfiles bounds the profiles kept warm; default DefaultMaxProfiles.
	MaxProfiles int
	// Handshake sends Claude Code's initialize request and lists an agent
	// only once it answered (the stand-in answers it too). Recommended.
	Handshake bool
	// SpawnTimeout bounds one spawn, handshake included.
	SpawnTimeout time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL when an agent stops.
	StopGrace time.Duration
	// Backoff is the first wait after a failed spawn (doubling up to a
	// minute); default one second.
	Backoff time.Duration
	// RefillDelay is how long after a Take the replacement starts, so its
	// start (about a second of CPU for Claude Code) does not compete with
	// the taken agent's first answer; default DefaultRefillDelay.
	RefillDelay time.Duration
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Pool keeps warm agents per profile. Its methods are safe for concurrent
// use.
type Pool struct {
	startstop.Base
	cfg Config
	log zerolog.Logger

	ctx    context.Context // ends at Stop: spawns under way give up
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	profiles map[Profile]*entry
	tick     uint64 // orders profiles by last use
	events   chan Event
}

// entry is one profile's agents.
type entry struct {
	ready    []*Agent
	spawning int
	used     uint64
	failures int
}

// EventKind says what happened to a warm agent.
type EventKind int

// Events, for logs, metrics and tests that wait on them.
const (
	EventReady       EventKind = iota + 1 // an agent was listed
	EventDied                             // a listed agent exited; it was dropped
	EventSpawnFailed                      // a spawn failed; it is retried after a backoff
)

// Event is one thing that happened in the pool.
type Event struct {
	Kind    EventKind
	Profile Profile
	Err     error
}

// New returns a pool; Start begins filling it.
func New(cfg Config) (*Pool, error) {
	if cfg.N < 1 {
		return nil, errors.New("warm: Config.N must be at least 1")
	}
	if cfg.Spawn == nil {
		return nil, errors.New("warm: Config.Spawn is required")
	}
	cfg.MaxProfiles = cmp.Or(cfg.MaxProfiles, DefaultMaxProfiles)
	cfg.SpawnTimeout = cmp.Or(cfg.SpawnTimeout, DefaultSpawnTimeout)
	cfg.StopGrace = cmp.Or(cfg.StopGrace, DefaultStopGrace)
	cfg.Backoff = cmp.Or(cfg.Backoff, time.Second)
	cfg.RefillDelay = cmp.Or(cfg.RefillDelay, DefaultRefillDelay)
	p := &Pool{cfg: cfg, profiles: map[Profile]*entry{}}
	p.Base.Name = "warm pool"
	p.log = zerolog.Nop()
	if cfg.Logger != nil {
		p.log = cfg.Logger.With().Str("component", "warm").Logger()
	}
	return p, nil
}

// Events returns a channel of the pool's events (buffered; events are
// dropped when it is full). Call it before Start.
func (p *Pool) Events() <-chan Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.events == nil {
		p.events = make(chan Event, 256)
	}
	return p.events
}

// Start begins keeping Config.Profiles warm.
func (p *Pool) Start(ctx context.Context) error {
	return p.Base.Start(ctx, func(context.Context) error {
		p.ctx, p.cancel = context.WithCancel(context.Background())
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, pr := range p.cfg.Profiles {
			p.want(pr)
		}
		return nil
	})
}

// Stop stops every agent not taken and waits for spawns under way (which
// stop what they started); ctx bounds the agents' stops.
func (p *Pool) Stop(ctx context.Context) error {
	return p.Base.Stop(ctx, func(ctx context.Context) error {
		p.cancel()
		p.mu.Lock()
		var all []*Agent
		for _, e := range p.profiles {
			all = append(all, e.ready...)
			e.ready = nil
		}
		p.mu.Unlock()
		errs := p.closeAll(ctx, all)
		p.wg.Wait()
		return errs
	})
}

// Take hands out a ready agent of profile pr, which the pool forgets
// (it is never handed out again) and replaces in the background. ok is
// false when none is ready; the profile is then kept warm for the next
// job. The taker calls Agent.Begin, and Agent.Close when done.
func (p *Pool) Take(pr Profile) (a *Agent, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.Running() {
		return nil, false
	}
	e := p.want(pr)
	if len(e.ready) == 0 {
		return nil, false
	}
	a = e.ready[0]
	e.ready = e.ready[1:]
	a.unwatch()
	p.fill(pr, e, p.cfg.RefillDelay)
	return a, true
}

// Ready is how many agents of pr are ready.
func (p *Pool) Ready(pr Profile) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.profiles[pr]; e != nil {
		return len(e.ready)
	}
	return 0
}

// want marks pr used and keeps it filled, making room among the profiles
// when there are too many. Called with mu held, while running.
func (p *Pool) want(pr Profile) *entry {
	p.tick++
	e := p.profiles[pr]
	if e == nil {
		if len(p.profiles) >= p.cfg.MaxProfiles {
			p.evictOldest()
		}
		e = &entry{}
		p.profiles[pr] = e
	}
	e.used = p.tick
	p.fill(pr, e, 0)
	return e
}

// evictOldest drops the least recently used profile, stopping its agents.
func (p *Pool) evictOldest() {
	var oldest Profile
	var oe *entry
	for pr, e := range p.profiles {
		if oe == nil || e.used < oe.used {
			oldest, oe = pr, e
		}
	}
	delete(p.profiles, oldest)
	p.stopLater(oe.ready)
	oe.ready = nil
}

// fill starts spawns, after delay at least, until ready plus spawning
// reach N. mu held.
func (p *Pool) fill(pr Profile, e *entry, delay time.Duration) {
	for len(e.ready)+e.spawning < p.cfg.N {
		e.spawning++
		if e.failures > 0 {
			delay = max(delay, min(p.cfg.Backoff<<min(e.failures-1, 16), maxBackoff))
		}
		p.wg.Go(func() { p.spawn(pr, e, delay) })
	}
}

func (p *Pool) spawn(pr Profile, e *entry, delay time.Duration) {
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
		}
	}
	a, err := p.start(pr)
	p.mu.Lock()
	defer p.mu.Unlock()
	e.spawning--
	live := p.ctx.Err() == nil && p.profiles[pr] == e
	switch {
	case err != nil:
		if live {
			e.failures++
			p.log.Warn().Err(err).Int("failures", e.failures).Msg("a warm agent could not be started; retrying")
			p.emit(Event{Kind: EventSpawnFailed, Profile: pr, Err: err})
			p.fill(pr, e, 0)
		}
	case !live:
		p.stopLater([]*Agent{a})
	default:
		e.failures = 0
		e.ready = append(e.ready, a)
		p.watch(pr, e, a)
		p.emit(Event{Kind: EventReady, Profile: pr})
	}
}

// start spawns one agent, with the handshake when configured.
func (p *Pool) start(pr Profile) (*Agent, error) {
	if err := p.ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.SpawnTimeout)
	defer cancel()
	sp, err := p.cfg.Spawn(ctx, pr)
	if err != nil {
		return nil, err
	}
	if sp.Process == nil {
		return nil, errors.New("warm: the spawn hook returned no process")
	}
	a := &Agent{profile: pr, sp: sp, spawned: time.Now(), stdout: sp.Process.Stdout(), grace: p.cfg.StopGrace}
	if !p.cfg.Handshake {
		return a, nil
	}
	type answer struct {
		r   io.Reader
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		r, err := handshake(sp.Process)
		ch <- answer{r, err}
	}()
	select {
	case ans := <-ch:
		if ans.err == nil {
			a.stdout = ans.r
			return a, nil
		}
		return nil, errors.Join(ans.err, a.Close(context.Background()))
	case <-ctx.Done():
		err = fmt.Errorf("warm: the agent did not answer its handshake: %w", context.Cause(ctx))
	}
	// Stopping the process ends the handshake's read.
	cerr := a.Close(context.Background())
	<-ch
	return nil, errors.Join(err, cerr)
}

// watch drops a listed agent that exits, and spawns its replacement.
// Take ends the watch. mu held.
func (p *Pool) watch(pr Profile, e *entry, a *Agent) {
	ctx, cancel := context.WithCancel(p.ctx)
	a.unwatch = cancel
	p.wg.Go(func() {
		st, err := a.sp.Process.Wait(ctx)
		if err != nil {
			return // taken, or the pool stops
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		i := indexOf(e.ready, a)
		if i < 0 {
			return
		}
		e.ready = append(e.ready[:i], e.ready[i+1:]...)
		p.log.Warn().Int("code", st.Code).Str("signal", st.Signal).Msg("a warm agent exited while it waited; replacing it")
		p.emit(Event{Kind: EventDied, Profile: pr})
		p.stopLater([]*Agent{a})
		if p.profiles[pr] == e && p.ctx.Err() == nil {
			p.fill(pr, e, 0)
		}
	})
}

func indexOf(as []*Agent, a *Agent) int {
	for i, x := range as {
		if x == a {
			return i
		}
	}
	return -1
}

// stopLater closes agents in the background (mu held by the caller).
func (p *Pool) stopLater(as []*Agent) {
	if len(as) == 0 {
		return
	}
	p.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StopGrace+10*time.Second)
		defer cancel()
		if err := p.closeAll(ctx, as); err != nil {
			p.log.Warn().Err(err).Msg("stopping warm agents")
		}
	})
}

func (p *Pool) closeAll(ctx context.Context, as []*Agent) error {
	errs := make([]error, len(as))
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Go(func() { errs[i] = a.Close(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// emit sends ev unless nobody listens or the buffer is full. mu held.
func (p *Pool) emit(ev Event) {
	if p.events == nil {
		return
	}
	select {
	case p.events <- ev:
	default:
	}
}
