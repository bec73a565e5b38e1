package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentfleet/agentfleet/internal/directget"
)

// GroupMin is the fewest queued lines the worker's relay sends as a group
// (sendGroup): a job's few lines go one acknowledgement each, with no
// count to read after them.
const GroupMin = 16

// groupMax is the most lines in one group (or the window, if larger): a
// group ends with a wait for the stream to catch up (its acknowledgement
// and count), which larger groups pay less often. In the relay benchmark
// groups of up to 256 lines gave no more lines per second than one
// acknowledgement each; 1,024 gave 5-10% more, 4,096 no more than 1,024.
const groupMax = 1024

// grouping reports whether the queued lines go out as a group.
func (r *Relay) grouping(queued int) bool {
	return r.groupMin > 0 && queued >= r.groupMin && r.window > 1 && r.gapFrom == 0 && r.direct != nil
}

// sendGroup publishes lines, nothing else of the relay's in flight: all
// but the last without a reply subject (the stream stores them and sends
// no acknowledgement), the last with one, and once that one is
// acknowledged it counts the query's lines stored since the last line
// known stored (one direct get). The acknowledgement says the stream has
// handled every earlier line of the connection; the count, that it stored
// them all (it says nothing of a line it refused, or one lost on the
// way). It returns with gapFrom unset when the count is right; otherwise
// (an error, a short count) gapFrom stays set and the group's lines go
// again one acknowledgement each, the stream dropping the copies of those
// it has.
//
// This saves the stream an acknowledgement per line and the relay the
// handling of one: one acknowledgement and one get for the whole group.
func (r *Relay) sendGroup(ctx context.Context, lines []outMsg) error {
	from := max(r.fence.Token(), r.lastSeq) + 1
	conn := r.nc.Stats().Reconnects
	r.gapFrom = lines[0].seq // until the group is counted whole
	defer func() {
		result := "stored"
		if r.gapFrom != 0 {
			result = "resent"
		}
		r.metrics.LineGroups.WithLabelValues(result).Inc()
	}()
	last := len(lines) - 1
	for _, m := range lines[:last] {
		msg := r.message(m)
		msg.Reply = ""
		if err := r.nc.PublishMsg(msg); err != nil {
			return err
		}
	}
	f, err := r.send(lines[last])
	if err != nil {
		return err
	}
	if err := r.await(ctx, f); err != nil {
		return err
	}
	if f.a.Err != nil {
		return f.a.Err
	}
	if f.buffered || f.conn != conn {
		r.log.Warn().Msg("a group of lines went out on more than one connection: sending them again one by one")
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	n, err := r.direct.Count(cctx, r.stream, r.subject, from)
	cancel()
	if errors.Is(err, directget.ErrNoDirect) {
		r.groupMin = 0 // a stream without direct gets: no more groups
	}
	if err != nil {
		return fmt.Errorf("relay: counting a group of lines: %w", err)
	}
	if n != uint64(len(lines)) {
		r.log.Warn().Int("sent", len(lines)).Uint64("stored", n).Msg("the stream did not store every line of a group: sending them again one by one")
		return nil
	}
	r.gapFrom = 0
	r.lastSeq = max(r.lastSeq, f.a.Seq)
	return nil
}
