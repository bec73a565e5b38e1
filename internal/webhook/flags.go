package webhook

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Flags are `dispatcher serve`'s webhook flags.
type Flags struct {
	Backoff      time.Duration
	AllowPrivate bool
}

// AddFlags defines --webhook-backoff and --webhook-allow-private (env
// FLEET_WEBHOOK_BACKOFF, FLEET_WEBHOOK_ALLOW_PRIVATE through config.Parse).
func AddFlags(fs *pflag.FlagSet, f *Flags) {
	fs.DurationVar(&f.Backoff, "webhook-backoff", DefaultBackoff, "first retry of a failed webhook delivery; doubles up to 1h, for 24h (env FLEET_WEBHOOK_BACKOFF)")
	fs.BoolVar(&f.AllowPrivate, "webhook-allow-private", false, "allow webhook receivers on loopback, private and link-local addresses (env FLEET_WEBHOOK_ALLOW_PRIVATE)")
}

// Check refuses values that cannot work.
func (f Flags) Check() error {
	if f.Backoff < 10*time.Millisecond || f.Backoff > MaxBackoff {
		return fmt.Errorf("--webhook-backoff %s: must be between 10ms and 1h", f.Backoff)
	}
	return nil
}
