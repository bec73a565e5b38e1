package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// tenantJobsInFlight bounds the tenants' job publishes served at once.
const tenantJobsInFlight = 256

// tenantJobs serves the jobs tenants publish on their <prefix>.jobs.<t>
// (imported from <prefix>.tsub.<t>): each is checked and rebuilt by
// tenancy.ScopeSubmission, published on <prefix>.jobs.<t> with a message
// id in the tenant's own namespace, and answered with JetStream's PubAck
// (or a PubAck error naming what was refused). Served concurrently.
type tenantJobs struct {
	nc    *nats.Conn
	names protocol.Names
	log   zerolog.Logger
	sub   *nats.Subscription
	slots chan struct{}
	wg    sync.WaitGroup
}

func (j *tenantJobs) start() error {
	j.slots = make(chan struct{}, tenantJobsInFlight)
	sub, err := j.nc.QueueSubscribe(tenancy.TenantSubmitSubject(j.names.Prefix(), "*"), queueGroup, j.dispatch)
	if err != nil {
		return fmt.Errorf("dispatcher: serving the tenants' jobs: %w", err)
	}
	j.sub = sub
	return nil
}

func (j *tenantJobs) stop(ctx context.Context) error {
	if j.sub == nil {
		return nil
	}
	closed := j.sub.StatusChanged(nats.SubscriptionClosed)
	if j.sub.Drain() == nil {
		select {
		case <-closed:
		case <-ctx.Done():
		}
	}
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (j *tenantJobs) dispatch(m *nats.Msg) {
	select {
	case j.slots <- struct{}{}:
	default:
		j.answer(m, nil, errors.New("the dispatcher is busy with other submissions; retry"))
		return
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer func() { <-j.slots }()
		ack, err := j.publish(m)
		j.answer(m, ack, err)
	}()
}

// publish checks m (a tenant's job) and publishes the job built from it.
func (j *tenantJobs) publish(m *nats.Msg) ([]byte, error) {
	tenant, _ := strings.CutPrefix(m.Subject, j.names.Prefix()+".tsub.")
	if err := tenancy.ValidTenant(tenant); err != nil {
		return nil, err
	}
	sub, err := tenancy.ScopeSubmission(tenant, m.Header, m.Data)
	if err != nil {
		j.log.Info().Err(err).Str("tenant", tenant).Msg("tenant job refused")
		return nil, err
	}
	out := nats.NewMsg(j.names.JobSubject(tenant))
	out.Data, out.Header = sub.Body, sub.Header
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := j.nc.RequestMsgWithContext(ctx, out)
	if err != nil {
		j.log.Warn().Err(err).Str("tenant", tenant).Str("query_id", sub.Job.ID).Msg("publishing a tenant's job")
		return nil, fmt.Errorf("publishing the job on %s: %w", out.Subject, err)
	}
	return r.Data, nil
}

// answer replies to the tenant with ack (the stream's PubAck) or a PubAck
// error naming err.
func (j *tenantJobs) answer(m *nats.Msg, ack []byte, err error) {
	if m.Reply == "" {
		return
	}
	if err != nil {
		code := 400
		if !errors.Is(err, tenancy.ErrScope) && !isValidation(err) {
			code = 503
		}
		ack, _ = json.Marshal(map[string]any{"error": map[string]any{"code": code, "err_code": 10000, "description": err.Error()}})
	}
	_ = m.Respond(ack)
}

func isValidation(err error) bool {
	var ve *protocol.ValidationError
	return errors.As(err, &ve) || strings.HasPrefix(err.Error(), "job: ") || strings.HasPrefix(err.Error(), protocol.HeaderMsgID)
}
