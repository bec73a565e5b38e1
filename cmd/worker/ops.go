package main

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/discovery"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ops is how a worker is operated beyond signals: the agentfleet-worker
// micro service (info, drain) and --exit-if-idle. done is closed by a
// signal, a drain request or idleness; why says which.
type ops struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	svc    micro.Service
	wg     sync.WaitGroup
	mu     sync.Mutex
	reason string
}

// Reasons a worker stops.
const (
	whySignal = "signal"
	whyDrain  = "drain requested"
	whyIdle   = "idle (--exit-if-idle)"
)

func startOps(ctx context.Context, nc *nats.Conn, names protocol.Names, w *worker.Worker, exitIfIdle time.Duration, log zerolog.Logger) (*ops, error) {
	o := &ops{}
	o.ctx, o.cancel = context.WithCancelCause(ctx)
	info := func() protocol.WorkerInfo {
		i := w.Info()
		if o.ctx.Err() != nil {
			i.State = protocol.WorkerDraining
		}
		return i
	}
	svc, err := discovery.ServeWorker(nc, names, discovery.Worker{
		ID: w.ID(), Info: info,
		Drain: func() {
			log.Info().Msg("drain requested")
			o.stopFor(whyDrain)
		},
	})
	if err != nil {
		return nil, err
	}
	o.svc = svc
	if exitIfIdle > 0 {
		o.wg.Go(func() { o.watchIdle(w, exitIfIdle, log) })
	}
	return o, nil
}

func (o *ops) stopFor(why string) {
	o.mu.Lock()
	if o.reason == "" {
		o.reason = why
	}
	o.mu.Unlock()
	o.cancel(nil)
}

func (o *ops) done() <-chan struct{} { return o.ctx.Done() }

func (o *ops) why() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.reason == "" {
		return whySignal
	}
	return o.reason
}

// stop ends discovery, after the worker has stopped.
func (o *ops) stop() {
	o.cancel(nil)
	o.wg.Wait()
	_ = o.svc.Stop()
}

// watchIdle stops the worker once it has run no job for d.
func (o *ops) watchIdle(w *worker.Worker, d time.Duration, log zerolog.Logger) {
	tick := time.NewTicker(min(d/4, time.Second))
	defer tick.Stop()
	idleSince := time.Now()
	for {
		select {
		case <-o.ctx.Done():
			return
		case now := <-tick.C:
			if w.Running() > 0 {
				idleSince = now
				continue
			}
			if now.Sub(idleSince) >= d {
				log.Info().Dur("idle", now.Sub(idleSince).Truncate(time.Millisecond)).Msg("no job for --exit-if-idle; exiting")
				o.stopFor(whyIdle)
				return
			}
		}
	}
}
