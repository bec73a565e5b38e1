package dispatcher

// Ending a query no worker will end: a dead letter's, or a cancelled
// queued one's. The dispatcher writes its synthetic result and terminal
// status, fenced against a worker that may still write its own.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ending is how the dispatcher ends a query no worker will end.
type ending struct {
	tenant, id            string
	attempt               int
	jobSeq                uint64
	state                 protocol.State
	reason, code, message string
	// expectStatusSeq, when not 0, makes the result line and the status
	// compare-and-sets against the query's .status subject: they are stored
	// only while its last message is still that one (the "queued" status a
	// cancel saw), so nothing is written once a worker has claimed the run.
	expectStatusSeq uint64
}

// Headers of a JetStream compare-and-set on another subject of the stream.
const (
	hdrExpectLastSubjectSeq        = "Nats-Expected-Last-Subject-Sequence"
	hdrExpectLastSubjectSeqSubject = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// ender ends queries no worker will end.
type ender struct {
	queryDeps
}

// end writes a query's synthetic result (on the stream, then in the
// transcript) and its terminal status, and reports whether it did. With
// expectStatusSeq set it reports false when a compare-and-set fails: a
// worker has the run.
func (x *ender) end(ctx context.Context, e ending) (bool, error) {
	n := x.names
	qs, err := x.js.Stream(ctx, n.QueriesStream())
	if err != nil {
		return false, err
	}
	var lastSeq uint64
	if last, err := qs.GetLastMsgForSubject(ctx, n.QueryMsg(e.tenant, e.id)); err == nil {
		lastSeq, _ = strconv.ParseUint(last.Header.Get(protocol.HeaderSeq), 10, 64)
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, err
	}
	seq := lastSeq + 1
	line := protocol.SyntheticResult(protocol.SyntheticInput{Reason: e.reason, Message: e.message})
	pm := nats.NewMsg(n.QueryMsg(e.tenant, e.id))
	pm.Data = line
	pm.Header.Set(protocol.HeaderSeq, strconv.FormatUint(seq, 10))
	pm.Header.Set(protocol.HeaderAttempt, strconv.Itoa(e.attempt))
	pm.Header.Set(protocol.HeaderMsgID, protocol.LineMsgID(e.tenant, e.id, e.attempt, seq))
	pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	if e.expectStatusSeq != 0 {
		pm.Header.Set(hdrExpectLastSubjectSeq, strconv.FormatUint(e.expectStatusSeq, 10))
		pm.Header.Set(hdrExpectLastSubjectSeqSubject, n.QueryStatus(e.tenant, e.id))
		// Two enders of the same status (the API's cancel and the
		// sessions consumer's, which reads the same .ctl cancel) write
		// one line: its id names the status both ended, not the line's
		// place, which the later one may read past the earlier's line.
		pm.Header.Set(protocol.HeaderMsgID, endingMsgID(e))
	}
	ack, err := x.js.PublishMsg(ctx, pm)
	if err != nil {
		if e.expectStatusSeq != 0 && fence.WrongLastSequence(err) {
			return false, nil
		}
		return false, fmt.Errorf("publishing the synthetic result: %w", err)
	}
	if ack.Duplicate {
		// Another ender's line: store that line, under the place it has,
		// so the transcript holds the line the stream has.
		if seq, line, err = storedLine(ctx, qs, ack.Sequence); err != nil {
			return false, err
		}
	}
	chunk := append(append([]byte(nil), line...), '\n')
	if err := x.objects.Put(ctx, storage.ChunkKey(e.tenant, e.id, seq, e.attempt), chunk); err != nil {
		return true, fmt.Errorf("storing the synthetic result: %w", err)
	}
	if err := storage.AssembleTranscript(ctx, x.objects, e.tenant, e.id); err != nil {
		return true, fmt.Errorf("assembling the transcript: %w", err)
	}
	code := e.code
	ev := protocol.StatusEvent{
		V: protocol.SchemaVersion, ID: e.id, Tenant: e.tenant, State: e.state, Attempt: e.attempt,
		JobSeq: e.jobSeq, Worker: "dispatcher", At: time.Now().UTC(),
		Error:  apiError(code, e.message),
		Result: &protocol.ResultSummary{Subtype: "error_during_execution", IsError: true, Synthetic: true, LastSeq: seq},
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return true, err
	}
	sm := nats.NewMsg(n.QueryStatus(e.tenant, e.id))
	sm.Data = b
	sm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	var opts []jetstream.PublishOpt
	if e.expectStatusSeq != 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(e.expectStatusSeq))
	}
	if _, err := x.js.PublishMsg(ctx, sm, opts...); err != nil {
		if e.expectStatusSeq != 0 && fence.WrongLastSequence(err) {
			// A worker wrote a status between the two compare-and-sets
			// (it claimed a cancelled run, or finished the last delivery):
			// the run is its to end.
			x.log.Warn().Str("tenant", e.tenant).Str("query_id", e.id).
				Msg("the query's status moved while the dispatcher was ending it (a worker wrote one); the dispatcher's result line stays on the stream")
			return false, nil
		}
		return true, fmt.Errorf("publishing the %s status: %w", e.state, err)
	}
	return true, nil
}

// endingMsgID is the Nats-Msg-Id of the synthetic result that ends e's
// query while its last status is the one at e.expectStatusSeq.
func endingMsgID(e ending) string {
	return "_end." + e.tenant + "." + e.id + "." + strconv.FormatUint(e.expectStatusSeq, 10)
}

// storedLine is the line stored at stream sequence at, and its Fleet-Seq.
func storedLine(ctx context.Context, qs jetstream.Stream, at uint64) (uint64, []byte, error) {
	m, err := qs.GetMsg(ctx, at)
	if err != nil {
		return 0, nil, fmt.Errorf("reading the synthetic result already written: %w", err)
	}
	seq, err := strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("the synthetic result already written has no %s: %w", protocol.HeaderSeq, err)
	}
	return seq, m.Data, nil
}
