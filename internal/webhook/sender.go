package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// sender delivers to one endpoint: a queue and InFlight workers.
type sender struct {
	queue chan string
	stop  chan struct{}
	once  sync.Once
}

func (sd *sender) close() { sd.once.Do(func() { close(sd.stop) }) }

// senderFor returns the endpoint's sender, starting it; nil when the
// service is stopping or the endpoint is gone. Callers hold s.mu.
func (s *Service) senderFor(epKey string) *sender {
	if s.ctx.Err() != nil {
		return nil
	}
	if sd := s.senders[epKey]; sd != nil {
		return sd
	}
	sd := &sender{queue: make(chan string, queueSize), stop: make(chan struct{})}
	s.senders[epKey] = sd
	for range s.cfg.InFlight {
		s.wg.Go(func() { s.work(sd) })
	}
	return sd
}

// enqueue hands a delivery to its endpoint's sender unless it is in hand
// already. A full queue leaves it to the sweeper: it never blocks.
func (s *Service) enqueue(epKey, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[key] {
		return
	}
	sd := s.senderFor(epKey)
	if sd == nil {
		return
	}
	select {
	case sd.queue <- key:
		s.pending[key] = true
	default:
	}
}

func (s *Service) release(key string) {
	s.mu.Lock()
	delete(s.pending, key)
	s.mu.Unlock()
}

func (s *Service) work(sd *sender) {
	for {
		select {
		case <-sd.stop:
			return
		case <-s.ctx.Done():
			return
		case key := <-sd.queue:
			s.deliver(key)
		}
	}
}

// deliver makes one attempt of a delivery and records it; a failure
// schedules the next attempt (or gives up after RetryFor).
func (s *Service) deliver(key string) {
	ctx := s.ctx
	e, err := s.delivs.Get(ctx, key)
	if err != nil {
		s.release(key)
		return
	}
	var d Delivery
	if json.Unmarshal(e.Value(), &d) != nil || d.Done || d.GaveUp {
		s.release(key)
		return
	}
	ep, ok := s.endpoint(d.Tenant, d.Endpoint)
	if !ok {
		s.release(key)
		return
	}
	now := s.cfg.Now()
	if wait := d.NextRetry.Sub(now); wait > 0 {
		s.schedule(ep, key, wait)
		return
	}
	// Claim the attempt: its record says it is due only after the attempt
	// could have ended, written only if nobody changed it since it was
	// read. Another dispatcher's sweeper then leaves it alone, and if this
	// one dies mid-attempt the claim runs out and the attempt is made again.
	claim := d
	claim.NextRetry = now.Add(s.cfg.Timeout + s.cfg.Sweep).UTC()
	cb, _ := json.Marshal(claim)
	rev, err := s.delivs.Update(ctx, key, cb, e.Revision())
	if err != nil {
		s.release(key) // another dispatcher has it, or the bucket is away: the sweeper decides
		return
	}
	a := s.post(ctx, ep, d)
	if ctx.Err() != nil {
		s.release(key) // stopping: not an attempt; the claim runs out and the next service makes it
		return
	}
	d.Attempts = append(d.Attempts, a)
	d.Done = a.Error == ""
	d.NextRetry = time.Time{}
	if !d.Done {
		next := now.Add(s.backoff(len(d.Attempts)))
		if next.Sub(d.Created) > s.cfg.RetryFor {
			d.GaveUp = true
		} else {
			d.NextRetry = next.UTC()
		}
	}
	b, _ := json.Marshal(d)
	if _, err := s.delivs.Update(ctx, key, b, rev); err != nil {
		s.log.Warn().Err(err).Str("webhook_id", d.WebhookID).Msg("recording a webhook attempt")
	}
	if !d.Done && !d.GaveUp {
		s.log.Info().Str("tenant", d.Tenant).Str("endpoint", d.Endpoint).Str("webhook_id", d.WebhookID).
			Str("error", a.Error).Time("next_retry", d.NextRetry).Msg("webhook delivery failed; will retry")
		s.schedule(ep, key, d.NextRetry.Sub(now))
		return
	}
	if d.GaveUp {
		s.log.Warn().Str("tenant", d.Tenant).Str("endpoint", d.Endpoint).Str("webhook_id", d.WebhookID).Msg("webhook delivery given up")
	}
	s.release(key)
}

// schedule hands key back to its sender after wait; it stays in hand.
func (s *Service) schedule(ep Endpoint, key string, wait time.Duration) {
	epKey := endpointKey(ep.Tenant, ep.ID)
	t := time.NewTimer(wait)
	s.wg.Go(func() {
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
		s.mu.Lock()
		sd := s.senderFor(epKey)
		s.mu.Unlock()
		if sd == nil {
			s.release(key)
			return
		}
		select {
		case sd.queue <- key:
		default:
			s.release(key) // full: the sweeper takes it
		}
	})
}

// backoff is the delay after the n-th failed attempt: Backoff doubling,
// at most MaxBackoff.
func (s *Service) backoff(n int) time.Duration {
	d := s.cfg.Backoff
	for i := 1; i < n && d < MaxBackoff; i++ {
		d *= 2
	}
	return min(d, MaxBackoff)
}

func (s *Service) endpoint(tenant, id string) (Endpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ep, ok := s.byTen[tenant][id]
	return ep, ok
}

// post makes one signed attempt.
func (s *Service) post(ctx context.Context, ep Endpoint, d Delivery) Attempt {
	a := Attempt{At: s.cfg.Now().UTC()}
	wh, err := standardwebhooks.NewWebhook(ep.Secret)
	if err != nil {
		a.Error = "the endpoint's secret: " + err.Error()
		return a
	}
	ts := time.Now()
	sig, err := wh.Sign(d.WebhookID, ts, d.Body)
	if err != nil {
		a.Error = "signing: " + err.Error()
		return a
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(d.Body))
	if err != nil {
		a.Error = err.Error()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "agentfleet-webhooks")
	req.Header.Set(standardwebhooks.HeaderWebhookID, d.WebhookID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	resp, err := s.client.Do(req)
	if err != nil {
		a.Error = attemptError(err)
		return a
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	a.Status = resp.StatusCode
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		a.Error = fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return a
}

// attemptError says why a request failed, without the URL (it may hold a
// token in its query).
func attemptError(err error) string {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && ue.Unwrap() != nil {
		err = ue.Unwrap()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
		return "timed out"
	}
	return err.Error()
}

// sweepLoop picks up due deliveries that are not in hand: after a
// restart, or when a queue was full.
func (s *Service) sweepLoop() {
	t := time.NewTicker(s.cfg.Sweep)
	defer t.Stop()
	for {
		s.sweep()
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Service) sweep() {
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	kl, err := s.delivs.ListKeys(ctx)
	if err != nil {
		if !errors.Is(err, jetstream.ErrNoKeysFound) && s.ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("listing webhook deliveries")
		}
		return
	}
	var keys []string
	for k := range kl.Keys() {
		keys = append(keys, k)
	}
	now := s.cfg.Now()
	for _, key := range keys {
		s.mu.Lock()
		held := s.pending[key]
		s.mu.Unlock()
		if held {
			continue
		}
		e, err := s.delivs.Get(ctx, key)
		if err != nil {
			continue
		}
		var d Delivery
		if json.Unmarshal(e.Value(), &d) != nil || d.Done || d.GaveUp || d.NextRetry.After(now) {
			continue
		}
		s.enqueue(endpointKey(d.Tenant, d.Endpoint), key)
	}
}
