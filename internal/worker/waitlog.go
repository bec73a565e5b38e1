package worker

import (
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// waitRepeat is how often a worker that cannot start pulling says again
// that it is still waiting.
const waitRepeat = 30 * time.Second

// waitLog says why the worker is not pulling yet (NATS unreachable, or no
// work consumer), with the NATS URL, and repeats it every waitRepeat with
// the time waited, so an operator never looks at minutes of silence.
type waitLog struct {
	since, last time.Time
}

func (l *waitLog) warn(log zerolog.Logger, nc *nats.Conn, err error, now time.Time) {
	if l.since.IsZero() {
		l.since = now
	} else if now.Sub(l.last) < waitRepeat {
		return
	}
	l.last = now
	ev := log.Warn().Err(err).Str("nats_url", natsURL(nc))
	if !l.last.Equal(l.since) {
		ev = ev.Dur("waited", now.Sub(l.since).Truncate(time.Second))
	}
	if !nc.IsConnected() {
		ev.Msg("waiting for NATS: not connected (is the server up and the URL right?)")
		return
	}
	ev.Msg("waiting for the work consumer (is the dispatcher running against this NATS and --prefix?)")
}

// natsURL is the server the connection uses or tries, without a password.
func natsURL(nc *nats.Conn) string {
	s := nc.ConnectedUrlRedacted()
	if s == "" {
		s = nc.Opts.Url
		if s == "" && len(nc.Opts.Servers) > 0 {
			s = nc.Opts.Servers[0]
		}
		if u, err := url.Parse(s); err == nil {
			s = u.Redacted()
		}
	}
	return s
}
