package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/pull"
)

func (w *Worker) loop(ctx context.Context) {
	defer close(w.loopDone)
	defer w.ready.Store(false)
	var waiting waitLog
	for !w.life.Stopping() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err := w.js.Consumer(cctx, w.names.JobsStream(), w.names.Consumer())
		cancel()
		if err != nil {
			waiting.warn(w.log, w.cfg.NC, err, time.Now())
			select {
			case <-time.After(w.cfg.ConsumerRetry):
			case <-w.stopCh:
			}
			continue
		}
		waiting = waitLog{}
		ackWait := cons.CachedInfo().Config.AckWait
		w.hb.setAckWait(ackWait)
		p, err := pull.New(w.cfg.NC, w.names.JobsStream(), w.names.Consumer(), 2*w.cfg.Slots+256, w.cfg.PullExpiry, w.cfg.PullHeartbeat)
		if err != nil {
			w.log.Error().Err(err).Msg("cannot pull from the work consumer")
			select {
			case <-time.After(w.cfg.ConsumerRetry):
			case <-w.stopCh:
			}
			continue
		}
		w.ready.Store(true)
		w.log.Info().Int("slots", w.cfg.Slots).Dur("ack_wait", ackWait).Msg("pulling jobs")
		err = w.pull(p, ackWait)
		p.Close()
		w.ready.Store(false)
		if err != nil {
			w.log.Warn().Err(err).Msg("pulling jobs; looking the work consumer up again")
		}
	}
}

// pull asks for as many jobs as there are free slots, in one pull request
// (not one per slot), and starts each job it is given, until the worker
// stops or the consumer is gone. A job given when no slot is free (a
// request thought lost that was answered after all) is handed back at once.
func (w *Worker) pull(p *pull.Puller, ackWait time.Duration) error {
	watch := time.NewTicker(p.Heartbeat())
	defer watch.Stop()
	for {
		if w.life.Stopping() {
			return nil
		}
		w.waitJournalRoom()
		if w.life.Stopping() {
			return nil
		}
		if free := cap(w.slots) - len(w.slots) - p.Pending(); free > 0 && w.cfg.NC.IsConnected() {
			if err := p.Ask(free); err != nil {
				w.log.Warn().Err(err).Msg("asking for jobs")
			}
		}
		select {
		case <-w.stopCh:
			return nil
		case <-w.freed:
		case now := <-watch.C:
			if p.Lost(now) {
				w.log.Warn().Msg("no answer to the pull request for two heartbeats; asking again")
			}
		case m := <-p.Msgs():
			if pull.IsStatus(m) {
				if err := p.Status(m); err != nil {
					if errors.Is(err, pull.ErrConsumerGone) {
						return err
					}
					w.log.Warn().Err(err).Msg("pulling jobs")
				}
				continue
			}
			w.take(p.Job(m), ackWait)
		}
	}
}

// take runs a job it was given in a free slot, or hands it back when
// there is none or the worker is stopping.
func (w *Worker) take(msg jetstream.Msg, ackWait time.Duration) {
	if w.life.Stopping() {
		_ = msg.Nak()
		return
	}
	select {
	case w.slots <- struct{}{}:
	default:
		_ = msg.Nak()
		return
	}
	if !w.holdWhileJournalFull(msg, ackWait) {
		_ = msg.Nak()
		<-w.slots
		return
	}
	w.metrics.running.Inc()
	w.metrics.freeSlots.Dec()
	w.jobs.Add(1)
	var once sync.Once
	// runEnded frees the slot once the agent has exited; the job's
	// bookkeeping (flush, terminal status, ack) may go on after it,
	// holding a finishing token instead, so at most Slots jobs finish
	// at once. Until it is acked the job still counts toward the
	// consumer's MaxAckPending, so fleet-wide concurrency stays exact.
	runEnded := func() {
		once.Do(func() {
			w.finishing <- struct{}{}
			w.metrics.running.Dec()
			w.metrics.freeSlots.Inc()
			<-w.slots
			select {
			case w.freed <- struct{}{}:
			default:
			}
		})
	}
	go func() {
		defer func() {
			runEnded()
			<-w.finishing
			w.jobs.Done()
		}()
		w.handle(msg, ackWait, runEnded)
	}()
}

// holdWhileJournalFull keeps a job pulled just before the journal's disk
// filled (heartbeating it, so it is neither redelivered nor counted as a
// delivery) until the disk has room. It reports false when the worker stops
// first.
func (w *Worker) holdWhileJournalFull(msg jetstream.Msg, ackWait time.Duration) bool {
	full, recovered := w.cfg.Journal.Full()
	if full == nil {
		return true
	}
	w.metrics.relay.JournalFull.Set(1)
	w.log.Error().Err(full).Msg("holding a pulled job until the journal's disk has room")
	t := time.NewTicker(max(ackWait/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-recovered:
			w.metrics.relay.JournalFull.Set(0)
			return true
		case <-t.C:
			_ = msg.InProgress()
		case <-w.stopCh:
			return false
		}
	}
}

// waitJournalRoom holds the pull loop while the journal's disk is full:
// running jobs go on (their lines still reach NATS), no new one starts.
func (w *Worker) waitJournalRoom() {
	full, recovered := w.cfg.Journal.Full()
	if full == nil {
		w.metrics.relay.JournalFull.Set(0)
		return
	}
	w.metrics.relay.JournalFull.Set(1)
	w.log.Error().Err(full).Msg("not pulling jobs until the journal's disk has room; running jobs go on")
	select {
	case <-recovered:
		w.metrics.relay.JournalFull.Set(0)
		w.log.Info().Msg("the journal's disk has room again; pulling jobs")
	case <-w.stopCh:
	}
}

// backoff is the NakWithDelay for an infrastructure failure on delivery n.
func backoff(n uint64) time.Duration {
	d := time.Second << min(n, 6)
	d = min(d, time.Minute)
	return d/2 + rand.N(d/2+1)
}
