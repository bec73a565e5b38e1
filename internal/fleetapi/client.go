package fleetapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// readTimeout bounds Follow's read of the query's last status.
const readTimeout = 10 * time.Second

// ErrUnavailable means NATS or the dispatcher did not answer.
var ErrUnavailable = errors.New("fleet: dispatcher unreachable")

// ErrNotFound means the query does not exist: nothing on its subjects and no
// status record.
var ErrNotFound = errors.New("fleet: no such query")

// Client talks to the fleet over NATS.
type Client struct {
	NC    *nats.Conn
	JS    jetstream.JetStream
	Names protocol.Names
	// APIPrefix is the JetStream API prefix of a tenant's client
	// (NewTenantClient); "" for the default.
	APIPrefix string
	// Local, if set, answers the API calls (submit, cancel, status, list,
	// session ops) in-process instead of over NATS: the dispatcher's own
	// HTTP API and dashboard use it, as the dispatcher's creds may not
	// publish the API subjects it serves.
	Local Requests
}

// Requests are the dispatcher's API calls. The error is ErrUnavailable
// (wrapped, naming the call) when no answer came in time.
type Requests interface {
	Submit(ctx context.Context, job protocol.Job) (protocol.SubmitReply, error)
	Cancel(ctx context.Context, ref protocol.QueryRef) (protocol.APIReply, error)
	Status(ctx context.Context, ref protocol.QueryRef) (protocol.APIReply, error)
	List(ctx context.Context, req protocol.ListRequest) (protocol.APIReply, error)
	SessionOp(ctx context.Context, op string, req protocol.SessionOpRequest) (protocol.APIReply, error)
	Schedule(ctx context.Context, req protocol.ScheduleRequest) (protocol.ScheduleReply, error)
}

// NewClient returns a client on nc.
func NewClient(nc *nats.Conn, names protocol.Names) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Client{NC: nc, JS: js, Names: names}, nil
}

func (c *Client) request(ctx context.Context, subject string, req, resp any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	rm := nats.NewMsg(subject)
	rm.Data = b
	// The caller's trace context (a producer's traceparent), for submit.
	if tp, ts := tracing.Inject(ctx); tp != "" {
		rm.Header.Set(tracing.HeaderTraceparent, tp)
		if ts != "" {
			rm.Header.Set(tracing.HeaderTracestate, ts)
		}
	}
	m, err := c.NC.RequestMsgWithContext(ctx, rm)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("%w: %s: %w", ErrUnavailable, subject, err)
		}
		return err
	}
	if err := json.Unmarshal(m.Data, resp); err != nil {
		return fmt.Errorf("fleet: unreadable reply on %s: %w", subject, err)
	}
	return nil
}

// Submit sends a job to the dispatcher (fleet.api.submit).
func (c *Client) Submit(ctx context.Context, job protocol.Job) (protocol.SubmitReply, error) {
	if c.Local != nil {
		return c.Local.Submit(ctx, job)
	}
	var r protocol.SubmitReply
	err := c.request(ctx, c.Names.APISubmit(), job, &r)
	return r, err
}

// Cancel asks the dispatcher to cancel a query.
func (c *Client) Cancel(ctx context.Context, ref protocol.QueryRef) (protocol.APIReply, error) {
	if c.Local != nil {
		return c.Local.Cancel(ctx, ref)
	}
	var r protocol.APIReply
	err := c.request(ctx, c.Names.APICancel(), ref, &r)
	return r, err
}

// Status asks the dispatcher for a query's status.
func (c *Client) Status(ctx context.Context, ref protocol.QueryRef) (protocol.APIReply, error) {
	if c.Local != nil {
		return c.Local.Status(ctx, ref)
	}
	var r protocol.APIReply
	err := c.request(ctx, c.Names.APIStatus(), ref, &r)
	return r, err
}

// List asks the dispatcher for recent queries.
func (c *Client) List(ctx context.Context, req protocol.ListRequest) (protocol.APIReply, error) {
	if c.Local != nil {
		return c.Local.List(ctx, req)
	}
	var r protocol.APIReply
	err := c.request(ctx, c.Names.APIList(), req, &r)
	return r, err
}

// Line is one relayed agent line as a subscriber sees it.
type Line struct {
	Seq     uint64
	Attempt int
	Data    []byte
	// At is when the stream stored the line (its JetStream timestamp).
	At time.Time
}

// Follower receives a query's history and live messages, in stream order.
type Follower struct {
	// Line is called for each .msg message.
	Line func(Line)
	// Status is called for each status event.
	Status func(protocol.StatusEvent)
	// Artifact is called for a workspace job's manifest (before its
	// terminal status).
	Artifact func(protocol.Artifact)
	// Model is called for each .model event (a model call the gateway
	// metered, docs/gateway.md), with its JetStream timestamp.
	Model func(at time.Time, data []byte)
	// MustExist makes Follow return ErrNotFound for a query with nothing
	// on the stream and no status record, instead of waiting for it to
	// appear (a job published straight to the work queue has no status
	// until a worker takes it).
	MustExist bool
}

// Follow replays a query from its first message (an ordered consumer on
// FLEET_QUERIES), then follows it live until a terminal status of its
// latest submission arrives, which it returns. With follow false it stops
// once it has caught up and returns (nil, nil) if the query has not ended.
//
// The latest submission is the one of the query's last status when Follow
// starts (a submission through the dispatcher has its queued status by
// then), or of a later status seen on the way: an id submitted again after
// its earlier run ended replays that run's ending too, and is followed past
// it to the new run's.
func (c *Client) Follow(ctx context.Context, tenant, id string, follow bool, f Follower) (*protocol.StatusEvent, error) {
	var latest uint64
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	last, err := c.lastStatus(rctx, tenant, id)
	cancel()
	switch {
	case err != nil:
		return nil, fmt.Errorf("fleet: tail %s/%s: %w", tenant, id, err)
	case last != nil:
		latest = last.JobSeq
	}
	cons, err := jsconsumer.Ordered(ctx, c.JS, c.Names.QueriesStream(), c.Names.QueryAll(tenant, id))
	if err != nil {
		return nil, fmt.Errorf("fleet: tail %s/%s: %w", tenant, id, err)
	}
	defer jsconsumer.Release(c.JS, c.Names.QueriesStream(), cons)
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: tail %s/%s: %w", tenant, id, err)
	}
	if info.NumPending == 0 && !follow && !f.MustExist {
		return nil, nil
	}
	if info.NumPending == 0 && f.MustExist {
		// Nothing on the stream (or it aged out): only a status record can
		// tell a finished query from one that never existed.
		r, err := c.Status(ctx, protocol.QueryRef{ID: id, Tenant: tenant})
		if err != nil {
			return nil, err
		}
		if r.Error != nil && r.Error.Code == protocol.CodeNotFound {
			return nil, fmt.Errorf("%w: %s/%s", ErrNotFound, tenant, id)
		}
		if r.Status != nil && r.Status.State.Terminal() {
			if f.Status != nil {
				f.Status(*r.Status)
			}
			return r.Status, nil
		}
		if !follow {
			return nil, nil
		}
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	msgSubj, statusSubj := c.Names.QueryMsg(tenant, id), c.Names.QueryStatus(tenant, id)
	artifactSubj, modelSubj := c.Names.QueryArtifact(tenant, id), c.Names.QueryModel(tenant, id)
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				continue
			}
			return nil, err
		}
		switch m.Subject() {
		case msgSubj:
			seq, _ := strconv.ParseUint(m.Headers().Get(protocol.HeaderSeq), 10, 64)
			att, _ := strconv.Atoi(m.Headers().Get(protocol.HeaderAttempt))
			if f.Line != nil {
				f.Line(Line{Seq: seq, Attempt: att, Data: m.Data(), At: stored(m)})
			}
		case modelSubj:
			if f.Model != nil {
				f.Model(stored(m), m.Data())
			}
		case artifactSubj:
			var a protocol.Artifact
			if f.Artifact != nil && json.Unmarshal(m.Data(), &a) == nil {
				f.Artifact(a)
			}
		case statusSubj:
			var ev protocol.StatusEvent
			if json.Unmarshal(m.Data(), &ev) == nil {
				if f.Status != nil {
					f.Status(ev)
				}
				latest = max(latest, ev.JobSeq)
				if ev.State.Terminal() && (ev.JobSeq == 0 || ev.JobSeq >= latest) {
					return &ev, nil
				}
			}
		}
		if !follow {
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				return nil, nil
			}
		}
	}
}

// stored is when the stream stored m (zero when not known).
func stored(m jetstream.Msg) time.Time {
	if md, err := m.Metadata(); err == nil {
		return md.Timestamp
	}
	return time.Time{}
}

// Schedule sends a schedule request to the dispatcher (fleet.api.schedule).
func (c *Client) Schedule(ctx context.Context, req protocol.ScheduleRequest) (protocol.ScheduleReply, error) {
	if c.Local != nil {
		return c.Local.Schedule(ctx, req)
	}
	var r protocol.ScheduleReply
	err := c.request(ctx, c.Names.APISchedule(), req, &r)
	return r, err
}
