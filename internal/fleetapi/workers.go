package fleetapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// gatherQuiet is how long Workers waits for one more worker to answer
// discovery after the last answer.
const gatherQuiet = 250 * time.Millisecond

// gather publishes a request on subject and collects every reply until
// none came for gatherQuiet (or ctx ends, or 1s passed without any).
func (c *Client) gather(ctx context.Context, subject string) ([][]byte, error) {
	inbox := c.NC.NewInbox()
	sub, err := c.NC.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.NC.PublishRequest(subject, inbox, nil); err != nil {
		return nil, err
	}
	var out [][]byte
	wait := time.Second
	for {
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil && len(out) == 0 {
				return nil, ctx.Err()
			}
			return out, nil
		}
		out = append(out, m.Data)
		wait = gatherQuiet
	}
}

// workerIDs finds the workers through $SRV.INFO.agentfleet-worker, of this
// client's prefix.
func (c *Client) workerIDs(ctx context.Context) ([]string, error) {
	subj, err := micro.ControlSubject(micro.InfoVerb, protocol.WorkerServiceName, "")
	if err != nil {
		return nil, err
	}
	replies, err := c.gather(ctx, subj)
	if err != nil {
		return nil, fmt.Errorf("fleet: worker discovery: %w", err)
	}
	var ids []string
	for _, b := range replies {
		var info micro.Info
		if json.Unmarshal(b, &info) != nil || info.Metadata["prefix"] != c.Names.Prefix() || info.Metadata["worker"] == "" {
			continue
		}
		if !slices.Contains(ids, info.Metadata["worker"]) {
			ids = append(ids, info.Metadata["worker"])
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// CountWorkers counts the workers that answer discovery.
func (c *Client) CountWorkers(ctx context.Context) (int, error) {
	ids, err := c.workerIDs(ctx)
	return len(ids), err
}

// Workers asks every worker for its info (state, slots, running jobs),
// sorted by id. A worker that found but then did not answer is left out.
func (c *Client) Workers(ctx context.Context) ([]protocol.WorkerInfo, error) {
	ids, err := c.workerIDs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]protocol.WorkerInfo, len(ids))
	ok := make([]bool, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			var info protocol.WorkerInfo
			if c.request(ctx, c.Names.WorkerInfoSubject(id), nil, &info) == nil {
				out[i], ok[i] = info, true
			}
		})
	}
	wg.Wait()
	var res []protocol.WorkerInfo
	for i := range out {
		if ok[i] {
			res = append(res, out[i])
		}
	}
	return res, nil
}

// Drain asks worker id to drain: stop pulling, let running jobs finish
// (or hand them back after its shutdown grace) and exit.
func (c *Client) Drain(ctx context.Context, id string) (protocol.WorkerInfo, error) {
	var info protocol.WorkerInfo
	err := c.request(ctx, c.Names.WorkerDrainSubject(id), nil, &info)
	if errors.Is(err, nats.ErrNoResponders) {
		return info, fmt.Errorf("%w: no worker %q", ErrNotFound, id)
	}
	return info, err
}
