// Package config holds what the fleet's commands share: every flag has an
// environment variable (flags win), the zerolog logger, and the NATS
// connection with reconnect settings fit for a long-running fleet.
package config

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
)

// Common are the settings every command has.
type Common struct {
	NATSURL   string
	NATSCreds string
	Prefix    string
	LogFormat string
	LogLevel  string
	// InboxPrefix is the connection's reply-inbox prefix. Each role has its
	// own (_INBOX_worker, _INBOX_dispatcher, _INBOX_client) so the server's
	// permissions can let a role read only its own replies.
	InboxPrefix string
}

// AddCommon defines the common flags on fs; role names the default reply
// inbox prefix (_INBOX_<role>).
func AddCommon(fs *pflag.FlagSet, c *Common, role string) {
	fs.StringVar(&c.InboxPrefix, "inbox-prefix", "_INBOX_"+role, "reply inbox prefix, for per-role NATS permissions (env FLEET_INBOX_PREFIX)")
	fs.StringVar(&c.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated (env FLEET_NATS_URL, else NATS_URL)")
	fs.StringVar(&c.NATSCreds, "nats-creds", "", "NATS credentials file (env FLEET_NATS_CREDS)")
	fs.StringVar(&c.Prefix, "prefix", "fleet", "subject prefix (env FLEET_PREFIX)")
	fs.StringVar(&c.LogFormat, "log-format", "json", "log format: json or console (env FLEET_LOG_FORMAT)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error (env FLEET_LOG_LEVEL)")
}

// Parse parses args into fs after filling every flag from its environment
// variable: FLEET_ + the flag name upper-cased with '-' as '_' (so
// --nats-url reads FLEET_NATS_URL). Flags given on the command line win.
// A flag whose FLEET_ variable is unset falls back to the variable other
// tools use for the same thing (NATS_URL, as the nats CLI and nats.go users
// set it, for --nats-url): flag > FLEET_NATS_URL > NATS_URL > default.
func Parse(fs *pflag.FlagSet, args []string) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil {
			return
		}
		env := EnvName(f.Name)
		v, ok := os.LookupEnv(env)
		if (!ok || v == "") && fallbackEnv[env] != "" {
			env = fallbackEnv[env]
			v, ok = os.LookupEnv(env)
		}
		if ok && v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	if err != nil {
		return err
	}
	return fs.Parse(args)
}

// fallbackEnv names, for a FLEET_ variable, the variable read when it is
// unset.
var fallbackEnv = map[string]string{"FLEET_NATS_URL": "NATS_URL"}

// RedactURLs hides passwords in a comma-separated list of server URLs, for
// messages and logs.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// EnvName is the environment variable of a flag.
func EnvName(flag string) string {
	return "FLEET_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Logger builds the zerolog logger (JSON on stderr, or console for people).
func Logger(c Common, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(c.LogLevel)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("--log-level: %w", err)
	}
	switch c.LogFormat {
	case "json", "":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !colorTerminal(w)}
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format must be json or console, not %q", c.LogFormat)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// Connect connects to NATS with settings for a fleet: reconnect forever,
// retry the first connect, and log (never swallow) async errors such as
// permission violations, which otherwise only show up as timeouts.
func Connect(c Common, name string, log zerolog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectJitter(500*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		nats.PingInterval(20 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				// Our own Close: not worth a warning.
				log.Debug().Msg("NATS connection closed")
				return
			}
			log.Warn().Err(err).Msg("NATS disconnected")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("NATS reconnected")
		}),
		nats.ErrorHandler(newAsyncErrors(log).handle),
	}
	if c.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	}
	if c.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	opts = append(opts, extra...)
	return nats.Connect(c.NATSURL, opts...)
}

// StopOnClosedConnection makes a connection that NATS closed for good (it
// never reconnects: the server refused its credentials twice) stop the
// service: it logs why, with the server's error, and calls stop. The
// returned func reports that error once it happened (nil otherwise), for
// the service's exit status. Without it the service waited forever, saying
// only "not connected".
func StopOnClosedConnection(nc *nats.Conn, log zerolog.Logger, stop context.CancelFunc) func() error {
	var closed atomic.Pointer[error]
	nc.SetClosedHandler(func(nc *nats.Conn) {
		err := nc.LastError()
		if err == nil {
			return // our own Close
		}
		closed.Store(&err)
		log.Error().Err(err).Msg("NATS closed the connection for good and it will not reconnect (are the credentials right?); stopping")
		stop()
	})
	return func() error {
		if p := closed.Load(); p != nil {
			return *p
		}
		return nil
	}
}

// ExitOnSecondSignal makes a second SIGINT or SIGTERM, after ctx (the first
// signal's context) is done, exit the process at once: the first one asks
// for a graceful shutdown, the second forces it.
func ExitOnSecondSignal(ctx context.Context, stop context.CancelFunc, log zerolog.Logger) {
	go func() {
		<-ctx.Done()
		stop() // restore default handling, then watch for the next signal
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
		<-c
		log.Warn().Msg("second signal: exiting now")
		os.Exit(1)
	}()
}

// ConnectJetStream connects (see Connect) and opens the JetStream API.
func ConnectJetStream(c Common, name string, log zerolog.Logger, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := Connect(c, name, log)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS at %s: %w", RedactURLs(c.NATSURL), err)
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// colorTerminal reports whether w is a terminal that wants colour (NO_COLOR
// unset, TERM not dumb).
func colorTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
