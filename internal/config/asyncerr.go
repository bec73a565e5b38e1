package config

import (
	"errors"
	"regexp"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// refusedRe finds the operation and subject of a permission violation:
// nats: permissions violation: Permissions Violation for Publish to "x".
var refusedRe = regexp.MustCompile(`(?i)violation for (publish|subscription) to "?([^"\s]+)"?`)

// asyncErrors logs a connection's async errors. A permission violation
// (NATS refusing one of this role's own publishes or subscriptions, which
// a requester otherwise only sees as a timeout) is logged once per
// operation and subject, at error, naming both; a repeat is at debug.
type asyncErrors struct {
	log  zerolog.Logger
	mu   sync.Mutex
	seen map[string]bool
}

func newAsyncErrors(log zerolog.Logger) *asyncErrors {
	return &asyncErrors{log: log, seen: map[string]bool{}}
}

func (a *asyncErrors) handle(_ *nats.Conn, sub *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		ev := a.log.Error().Err(err)
		if sub != nil {
			ev = ev.Str("subject", sub.Subject)
		}
		ev.Msg("NATS async error")
		return
	}
	op, subject := "publish", ""
	if m := refusedRe.FindStringSubmatch(err.Error()); m != nil {
		op, subject = m[1], m[2]
	} else if sub != nil {
		op, subject = "subscription", sub.Subject
	}
	key := op + " " + subject
	a.mu.Lock()
	first := !a.seen[key]
	a.seen[key] = true
	a.mu.Unlock()
	ev := a.log.Debug()
	if first {
		ev = a.log.Error()
	}
	ev.Err(err).Str("operation", op).Str("subject", subject).
		Msg("NATS refused this connection's " + op + " (its credentials do not allow the subject); requests that need it will time out")
}
