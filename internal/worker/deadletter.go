package worker

import (
	"cmp"
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// deadLetter copies a job the worker is about to terminate as invalid to the
// dead-letter stream, with its reason, so that a body nobody can read (not
// JSON, no id) is still there for an operator to find (dispatcher ls --dlq)
// after the work queue dropped it. The copy is deduplicated by the job's
// stream sequence, so a retry after a failed Term adds nothing.
func (w *Worker) deadLetter(ctx context.Context, msg jetstream.Msg, tenant, reason string) error {
	dl := nats.NewMsg(w.names.DLQ(cmp.Or(tenant, protocol.DefaultTenant)))
	dl.Data = msg.Data()
	for k, v := range msg.Headers() {
		dl.Header[k] = v
	}
	dl.Header.Set(protocol.HeaderReason, protocol.CodeInvalidJob)
	dl.Header.Set(protocol.HeaderError, reason)
	msgID := "dlq-" + w.names.JobsStream() + "-" + msg.Subject()
	if md, err := msg.Metadata(); err == nil {
		seq := strconv.FormatUint(md.Sequence.Stream, 10)
		dl.Header.Set(protocol.HeaderStreamSeq, seq)
		msgID = "dlq-" + w.names.JobsStream() + "-" + seq
	}
	dl.Header.Set(protocol.HeaderMsgID, msgID)
	if _, err := w.js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("copying the invalid job to %s: %w", dl.Subject, err)
	}
	return nil
}
