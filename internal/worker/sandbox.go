package worker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/codes"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// box is an attempt's sandbox, made in the background from the moment the
// job is taken (while the claim is in flight), and destroyed in the
// background once the run is over or will not happen (Stop waits for
// both, through the worker's cleanup group).
type box struct {
	cleanup *sync.WaitGroup
	log     zerolog.Logger
	wait    func() (sandbox.Sandbox, error)
	// close, when set, ends the sandbox instead of Destroy (a warm
	// agent's: its process stopped, then its sandbox released; warm.go).
	close func(context.Context) error
}

// newBox starts making the sandbox of spec with provider, bounded by
// CreateTimeout.
func newBox(ctx context.Context, w *Worker, log zerolog.Logger, provider sandbox.Provider, spec sandbox.Spec) *box {
	type result struct {
		sb  sandbox.Sandbox
		err error
	}
	ch := make(chan result, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, w.cfg.CreateTimeout)
		defer cancel()
		cctx, span := w.cfg.Tracing.Tracer().Start(cctx, "fleet.sandbox.create")
		sb, err := provider.Create(cctx, spec)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		ch <- result{sb, err}
	}()
	return &box{cleanup: &w.cleanup, log: log, wait: sync.OnceValues(func() (sandbox.Sandbox, error) {
		r := <-ch
		return r.sb, r.err
	})}
}

// discard destroys the sandbox the run will not use, in the background.
func (b *box) discard() {
	b.cleanup.Go(func() {
		sb, err := b.wait()
		if err != nil {
			return
		}
		b.destroyNow(sb, "destroying an unused sandbox")
	})
}

// destroy destroys sb, the run's sandbox, in the background.
func (b *box) destroy(sb sandbox.Sandbox) {
	b.cleanup.Go(func() { b.destroyNow(sb, "destroying the sandbox") })
}

func (b *box) destroyNow(sb sandbox.Sandbox, what string) {
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	destroy := sb.Destroy
	if b.close != nil {
		destroy = b.close
	}
	if err := destroy(dctx); err != nil {
		b.log.Warn().Err(err).Msg(what)
	}
}

// sandboxSpec is the one place an attempt's sandbox is specified.
func sandboxSpec(job *protocol.Job, msgSeq uint64, attempt int) sandbox.Spec {
	return sandbox.Spec{ID: sandboxID(job, msgSeq, attempt)}
}

func sandboxID(job *protocol.Job, msgSeq uint64, attempt int) string {
	// The work message's sequence makes the name unique per run: a
	// session's continuation is a new message of the same query whose
	// delivery is attempt 1 again, created while the parked run's sandbox
	// may still be being destroyed in the background.
	id := job.Tenant + "-" + job.ID + "-" + strconv.FormatUint(msgSeq, 10) + "-" + strconv.Itoa(attempt)
	if len(id) > 128 {
		id = id[len(id)-128:]
	}
	return id
}

// failedSandbox stands for a sandbox that could not be created for a
// non-retryable reason: starting a process in it fails, which the runner
// reports as a spawn failure.
type failedSandbox struct{ err error }

func (f failedSandbox) ID() string { return "" }
func (f failedSandbox) Start(context.Context, sandbox.ProcSpec) (sandbox.Process, error) {
	return nil, fmt.Errorf("%w: %w", sandbox.ErrInvalid, f.err)
}
func (f failedSandbox) WriteFile(context.Context, string, []byte) error { return f.err }
func (f failedSandbox) ReadFile(context.Context, string) ([]byte, error) {
	return nil, f.err
}
func (f failedSandbox) Destroy(context.Context) error { return nil }
