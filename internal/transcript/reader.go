package transcript

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// pageLines is how many lines one batched direct get, or one pull of a
// read-back consumer, asks for.
const pageLines = 1000

// directLines is how many of a query's lines the archiver reads with
// batched direct gets before it reads the rest through a consumer.
//
// Every line a direct get returns comes with six headers the server adds
// (stream, subject, sequence, time, pending, last sequence), written with
// net/http.Header.Write and parsed again by the reader; a consumer
// delivers the line's own headers only, its position in the reply subject.
// Reading the rest through a consumer cut the fleet's CPU per archived
// line by 40% (the relay benchmark's relay_archive_cpu_us_per_line) and
// per 20,000-line job by 56%. A consumer costs a create and a delete, so
// short transcripts, most of them, keep to direct gets and make none: a
// transcript makes a consumer only past directLines lines.
const directLines = 256

// Reader reads a query's lines from FLEET_QUERIES and writes transcripts
// from them; the archiver uses it, and a worker's journal merges the
// chunks it stores late through it.
type Reader struct {
	names protocol.Names
	store storage.Store
	mux   *directget.Mux // the batched gets' replies, on one subscription
	// js, when set, reads long transcripts past directLines through an
	// ephemeral consumer (the archiver's Reader; a worker may not create
	// consumers on .msg subjects, and merges rarely).
	js jetstream.JetStream
}

// NewReader returns a Reader.
func NewReader(nc *nats.Conn, names protocol.Names, store storage.Store) *Reader {
	return &Reader{names: names, store: store, mux: directget.New(nc)}
}

// WithConsumer makes r read long transcripts, past directLines lines,
// through an ephemeral consumer made with js (the archiver's Reader; a
// worker may not create consumers on .msg subjects). It returns r.
func (r *Reader) WithConsumer(js jetstream.JetStream) *Reader {
	r.js = js
	return r
}

// Lines reads every .msg line of the query from the stream, with batched
// direct gets (the stream must allow direct gets, as FLEET_QUERIES does),
// and past directLines lines through a consumer if the Reader has one
// (see directLines); if that consumer cannot be made, direct gets read the
// rest. Large-line pointers are resolved from storage (storage.LineKey);
// complete is false when one of them is not there (yet), and that line is
// left out.
func (r *Reader) Lines(ctx context.Context, tenant, id string) (lines []storage.StreamLine, complete bool, err error) {
	subj := r.names.QueryMsg(tenant, id)
	complete = true
	add := func(hdr nats.Header, data []byte) error {
		l, ok, err := r.line(ctx, tenant, id, hdr, data)
		if err != nil {
			return err
		}
		if ok {
			lines = append(lines, l)
		} else if l.Seq != 0 {
			complete = false
		}
		return nil
	}
	batch := pageLines
	if r.js != nil {
		batch = directLines
	}
	var from uint64
	for {
		more, last, err := r.page(ctx, subj, from, batch, add)
		if err != nil && r.js != nil && errors.Is(err, nats.ErrNoResponders) {
			// No replica answers direct gets yet (an R3 stream's replicas
			// answer once they are current, which on a busy cluster can
			// take minutes): the consumer reads from the stream's leader.
			if cerr := r.consume(ctx, subj, from, add); cerr == nil {
				return lines, complete, nil
			} else if !errors.Is(cerr, errNoConsumer) {
				return nil, false, cerr
			}
		}
		if err != nil {
			return nil, false, err
		}
		if !more {
			return lines, complete, nil
		}
		from = last + 1
		if r.js != nil && batch == directLines {
			batch = pageLines
			err := r.consume(ctx, subj, from, add)
			if err == nil {
				return lines, complete, nil
			}
			if !errors.Is(err, errNoConsumer) {
				return nil, false, err
			}
			// No consumer (a limit, a permission): direct gets go on.
		}
	}
}

// page reads up to batch of subj's lines from stream sequence from on with
// one batched direct get, handing each to add; more says the subject has
// lines after the last one read (at stream sequence last).
func (r *Reader) page(ctx context.Context, subj string, from uint64, batch int, add func(nats.Header, []byte) error) (more bool, last uint64, err error) {
	more, last, err = r.mux.Page(ctx, r.names.QueriesStream(), subj, from, batch, 0, func(m *nats.Msg, _ uint64) error {
		return add(m.Header, m.Data)
	})
	if err != nil {
		return false, 0, fmt.Errorf("transcript: reading %s: %w", subj, err)
	}
	return more, last, nil
}

// createTimeout bounds the read-back consumer's create.
const createTimeout = 5 * time.Second

// errNoConsumer: the read-back consumer could not be made.
var errNoConsumer = errors.New("transcript: no read-back consumer")

// consume reads subj's lines from stream sequence from to the last one
// through an ephemeral consumer (in memory, one replica, no acks), in
// no-wait pulls of pageLines, and deletes it. It stops at the line the
// server counts nothing pending after, or at an empty pull.
func (r *Reader) consume(ctx context.Context, subj string, from uint64, add func(nats.Header, []byte) error) error {
	stream := r.names.QueriesStream()
	// Bounded apart from the read: a create left unanswered (a cluster
	// electing its meta leader) must leave time for the direct gets.
	cctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	c, err := r.js.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{
		FilterSubject: subj,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   from,
		AckPolicy:     jetstream.AckNonePolicy,
		MemoryStorage: true,
		Replicas:      1,
		// Left behind only if this process dies; Release deletes it.
		InactiveThreshold: jsconsumer.InactiveThreshold,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", errNoConsumer, err)
	}
	defer jsconsumer.Release(r.js, stream, c)
	for {
		b, err := c.FetchNoWait(pageLines)
		if err != nil {
			return fmt.Errorf("transcript: reading %s: %w", subj, err)
		}
		n := 0
		for m := range b.Messages() {
			n++
			if err := add(m.Headers(), m.Data()); err != nil {
				return err
			}
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				return nil
			}
		}
		if err := b.Error(); err != nil {
			return fmt.Errorf("transcript: reading %s: %w", subj, err)
		}
		if n == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("transcript: reading %s: %w", subj, err)
		}
	}
}

// line turns one .msg message into its stored line; a large-line pointer
// is resolved from storage (ok is false, with l.Seq set, when the line is
// not there).
func (r *Reader) line(ctx context.Context, tenant, id string, hdr nats.Header, data []byte) (l storage.StreamLine, ok bool, err error) {
	seq, perr := strconv.ParseUint(hdr.Get(protocol.HeaderSeq), 10, 64)
	if perr != nil || seq == 0 {
		return storage.StreamLine{}, false, nil
	}
	attempt, _ := strconv.Atoi(hdr.Get(protocol.HeaderAttempt))
	l = storage.StreamLine{Seq: seq, Attempt: attempt, Data: data}
	if msg := protocol.ParseMessage(data); msg.Type == protocol.TypeLargeLine {
		whole, err := r.store.Get(ctx, storage.LineKey(tenant, id, seq))
		if errors.Is(err, storage.ErrNotFound) {
			return l, false, nil
		}
		if err != nil {
			return l, false, err
		}
		l.Data = whole
	}
	return l, true, nil
}

// Merge writes the query's transcript from the stream and its chunk
// objects (storage.MergeTranscript). It repeats while the chunks change
// during a merge, so the transcript it leaves has seen every chunk stored
// before its last write.
func (r *Reader) Merge(ctx context.Context, tenant, id string) error {
	for range 10 {
		lines, _, err := r.Lines(ctx, tenant, id)
		if err != nil {
			return err
		}
		data, keys, err := storage.MergeTranscript(ctx, r.store, tenant, id, lines)
		if err != nil {
			return err
		}
		if err := r.store.Put(ctx, storage.TranscriptKey(tenant, id), data); err != nil {
			return err
		}
		after, err := storage.ChunkKeys(ctx, r.store, tenant, id)
		if err != nil {
			return err
		}
		if slices.Equal(keys, after) {
			return nil
		}
	}
	return fmt.Errorf("transcript: merging %s/%s: chunks kept changing", tenant, id)
}

// MergeIfArchived merges the query's chunks into its transcript if the
// archiver wrote one already; otherwise the archiver merges them when the
// query ends. A journal calls it once it has stored chunks.
func (r *Reader) MergeIfArchived(ctx context.Context, tenant, id string) error {
	if _, err := r.store.Get(ctx, storage.TranscriptKey(tenant, id)); err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil
		}
		return err
	}
	return r.Merge(ctx, tenant, id)
}
