package schedule

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// FireConsumer is the durable consumer of firings.
const FireConsumer = "dispatcher-schedules"

// SubmitFunc submits a job the way the fleet's API does (validated,
// de-duplicated by tenant and id, "queued" recorded). It returns nil or
// the refusal; permanent says a retry cannot succeed.
type SubmitFunc func(ctx context.Context, job *protocol.Job) (permanent bool, err error)

// Firer turns firings into jobs. Start and Stop are its owner's (the
// dispatcher's) to call, once each.
type Firer struct {
	js     jetstream.JetStream
	names  protocol.Names
	submit SubmitFunc
	log    zerolog.Logger
	cc     jetstream.ConsumeContext
}

// NewFirer returns a Firer submitting with submit.
func NewFirer(js jetstream.JetStream, names protocol.Names, submit SubmitFunc, log zerolog.Logger) *Firer {
	return &Firer{js: js, names: names, submit: submit, log: log.With().Str("component", "schedules").Logger()}
}

// Start opens the consumer and handles firings until Stop.
func (f *Firer) Start(ctx context.Context) error {
	var cons jetstream.Consumer
	err := provision.Retry(ctx, func(ctx context.Context) (err error) {
		cons, err = f.js.CreateOrUpdateConsumer(ctx, f.names.SchedulesStream(), jetstream.ConsumerConfig{
			Durable:       FireConsumer,
			Description:   "agentfleet dispatchers: schedule firings to jobs",
			FilterSubject: f.names.Prefix() + ".fire.*.*",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       30 * time.Second,
			MaxAckPending: 64,
			BackOff:       nil,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("schedule: the firings consumer: %w", err)
	}
	cc, err := cons.Consume(f.handle)
	if err != nil {
		return fmt.Errorf("schedule: consuming firings: %w", err)
	}
	f.cc = cc
	return nil
}

// Stop stops taking firings; the one in hand finishes first.
func (f *Firer) Stop(context.Context) error {
	if f.cc != nil {
		f.cc.Drain()
		<-f.cc.Closed()
		f.cc = nil
	}
	return nil
}

func (f *Firer) handle(m jetstream.Msg) {
	job, err := f.jobOf(m)
	if err != nil {
		f.log.Error().Err(err).Str("subject", m.Subject()).Msg("a firing that is not a job; dropped")
		_ = m.Term()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	permanent, err := f.submit(ctx, job)
	switch {
	case err == nil:
		f.log.Info().Str("tenant", job.Tenant).Str("schedule", job.Trigger.Name).Str("query_id", job.ID).Msg("schedule fired")
		_ = m.Ack()
	case permanent:
		f.log.Error().Err(err).Str("tenant", job.Tenant).Str("schedule", job.Trigger.Name).Str("query_id", job.ID).Msg("schedule fired a job that was refused")
		_ = m.Term()
	default:
		f.log.Warn().Err(err).Str("tenant", job.Tenant).Str("schedule", job.Trigger.Name).Msg("submitting a schedule's job; will retry")
		_ = m.NakWithDelay(2 * time.Second)
	}
}

// jobOf is the job a firing submits.
func (f *Firer) jobOf(m jetstream.Msg) (*protocol.Job, error) {
	rest, ok := strings.CutPrefix(m.Subject(), f.names.Prefix()+".fire.")
	tenant, name, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return nil, fmt.Errorf("not a firing subject")
	}
	meta, err := m.Metadata()
	if err != nil {
		return nil, err
	}
	var def Definition
	if err := json.Unmarshal(m.Data(), &def); err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	if def.Tenant != tenant || def.Name != name {
		return nil, fmt.Errorf("the definition is %s/%s's, not %s/%s's", def.Tenant, def.Name, tenant, name)
	}
	return FiredJob(def, meta.Timestamp), nil
}

// FiredJob is the job def submits when it fires at t.
func FiredJob(def Definition, t time.Time) *protocol.Job {
	job := def.Job
	at := t.UTC().Truncate(time.Second)
	job.ID = protocol.ScheduleJobID(def.Name, at)
	job.Tenant = def.Tenant
	job.Trigger = &protocol.Trigger{Kind: protocol.TriggerSchedule, Name: def.Name, FireAt: &at}
	return &job
}
