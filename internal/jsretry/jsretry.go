// Package jsretry repeats a JetStream API request that is safe to repeat
// (a create or update to a given configuration, a bucket opened) while the
// cluster cannot answer yet: both the dispatcher's provisioning and the
// worker's opening of its storage use it, so it lives where both roles may
// import it.
package jsretry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// attemptTimeout bounds each try of a JetStream API request that Do
// repeats.
var attemptTimeout = 10 * time.Second

// SetAttemptTimeout sets the bound of each try and returns a function that
// restores the previous one: for tests that lose a reply on purpose.
func SetAttemptTimeout(d time.Duration) (restore func()) {
	old := attemptTimeout
	attemptTimeout = d
	return func() { attemptTimeout = old }
}

// Do runs fn, a JetStream API request that is safe to repeat (a create or
// update to a given configuration), with a context of at most
// attemptTimeout, until it succeeds, fails for good, or ctx ends; between
// tries it waits 100 ms, doubling up to 2 s.
//
// On a cluster a request can go unanswered (the meta leader changed while
// it was in flight, or none is elected yet) and nats.go waits for its
// whole context: a dispatcher starting during an election, or on a loaded
// machine, waited out its start timeout on one lost reply (a CI run:
// "provision: stream FLEET_ADVISORIES: context deadline exceeded" after
// 2 minutes, the three streams before it made). A try that times out, finds
// no responders, or gets a "cluster not available", "no suitable peers" or
// 503 answer is tried again; any other error is returned at once.
func Do(ctx context.Context, fn func(context.Context) error) error {
	backoff := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil || !Transient(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last try: %w)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Server error codes of a cluster that cannot place or answer yet.
const (
	errCodeClusterNoPeers   jetstream.ErrorCode = 10005
	errCodeClusterNotAvail  jetstream.ErrorCode = 10008
	errCodeClusterNotLeader jetstream.ErrorCode = 10009
)

// Transient reports whether err is one another try may cure: a timeout, no
// responders, or a cluster that cannot place or answer yet.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders):
		return true
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case errCodeClusterNoPeers, errCodeClusterNotAvail, errCodeClusterNotLeader:
			return true
		}
		return apiErr.Code == 503
	}
	return false
}
