package cfkv

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime/multipart"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cloudflare "github.com/cloudflare/cloudflare-go/v4"
	"github.com/cloudflare/cloudflare-go/v4/kv"
	"github.com/cloudflare/cloudflare-go/v4/option"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Bulk write limits: Cloudflare allows 10,000 pairs and 100 MB per request;
// the byte budget keeps a margin for JSON framing.
const (
	bulkMaxItems = 10000
	bulkMaxBytes = 90_000_000
)

// writeOp is the latest pending write (value or delete) of one key, and
// every Put/Delete call waiting for it (or for a newer one) to be written.
type writeOp struct {
	del     bool
	value   []byte
	meta    json.RawMessage
	waiters []chan error // each buffered 1
	tries   int          // bulk rounds that left this key unsuccessful
}

// keyState is the coalescer's view of one key.
type keyState struct {
	pending  *writeOp // not sent yet; nil when nothing waits
	inflight bool     // a write of this key is being sent
	last     time.Time
}

// item is one key taken for a write round.
type item struct {
	key string
	op  *writeOp
	st  *keyState
}

// writer coalesces writes: per key, only the latest value is sent, at most
// once per KeyWriteInterval (measured from the end of the previous write of
// that key to the start of the next, so the server never sees two writes
// of a key closer than the interval); keys ready at the same time go out in
// one bulk request. One goroutine (run) sends everything, in rounds.
type writer struct {
	s *Store

	mu      sync.Mutex
	keys    map[string]*keyState
	closing atomic.Bool
	wake    chan struct{} // buffered 1

	ctx    context.Context // the flusher's lifetime; cancelled when Close gives up
	cancel context.CancelFunc
	done   chan struct{}

	// onEnqueue, when set (tests), is called under mu for every submitted
	// op, in the order the coalescer accepted them.
	onEnqueue func(key string, del bool, value []byte)
}

func newWriter(s *Store) *writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{
		s:      s,
		keys:   map[string]*keyState{},
		wake:   make(chan struct{}, 1),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go w.run()
	return w
}

func (w *writer) isClosed() bool { return w.closing.Load() }

func (w *writer) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// submit queues op for key and waits until it, or a newer op of key, has
// been written, or until ctx ends.
func (w *writer) submit(ctx context.Context, key string, op *writeOp) error {
	done := make(chan error, 1)
	w.mu.Lock()
	if w.closing.Load() {
		w.mu.Unlock()
		return ErrClosed
	}
	st := w.keys[key]
	if st == nil {
		st = &keyState{}
		w.keys[key] = st
	}
	p := st.pending
	if p == nil {
		p = op
		st.pending = p
	} else {
		// Latest wins: the older callers are satisfied by the newer value.
		p.del, p.value, p.meta, p.tries = op.del, op.value, op.meta, 0
	}
	p.waiters = append(p.waiters, done)
	if w.onEnqueue != nil {
		w.onEnqueue(key, op.del, op.value)
	}
	w.mu.Unlock()
	w.signal()

	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	w.mu.Lock()
	if w.keys[key] == st && st.pending == p {
		// Not sent yet: withdraw this caller; drop the op if nobody else waits.
		if i := slices.Index(p.waiters, done); i >= 0 {
			p.waiters = slices.Delete(p.waiters, i, i+1)
		}
		if len(p.waiters) == 0 {
			st.pending = nil
		}
		w.mu.Unlock()
		return ctx.Err()
	}
	w.mu.Unlock()
	// Already being sent: it may still be written.
	select {
	case err := <-done:
		return err
	default:
		return fmt.Errorf("%w (the write was already in flight and may still land)", ctx.Err())
	}
}

// run is the flusher goroutine.
func (w *writer) run() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		puts, dels, next, more, exit := w.take()
		if len(puts)+len(dels) > 0 {
			w.flushPuts(puts)
			w.flushDels(dels)
			continue
		}
		if more {
			continue
		}
		if exit {
			return
		}
		var tc <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tc = timer.C
		}
		select {
		case <-w.wake:
		case <-tc:
		case <-w.ctx.Done():
			return
		}
		if tc != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// take moves the keys that may be written now out of pending. next is the
// earliest time another key becomes writable (zero if none waits), more
// says a batch was full and ready keys remain, exit says the store is
// closing and nothing is pending (decided under mu, so no submit can slip
// in after it: submit checks closing under the same lock).
func (w *writer) take() (puts, dels []item, next time.Time, more, exit bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	interval := w.s.cfg.KeyWriteInterval
	idle := true
	defer func() { exit = idle && w.closing.Load() }()
	putBytes := 0
	for key, st := range w.keys {
		if st.inflight {
			continue
		}
		if st.pending == nil {
			if now.Sub(st.last) >= interval {
				delete(w.keys, key) // forget keys idle for longer than the interval
			}
			continue
		}
		idle = false
		if ready := st.last.Add(interval); now.Before(ready) {
			if next.IsZero() || ready.Before(next) {
				next = ready
			}
			continue
		}
		op := st.pending
		if op.del {
			if len(dels) >= bulkMaxItems {
				more = true
				continue
			}
			dels = append(dels, item{key: key, op: op, st: st})
		} else {
			size := len(key) + base64.StdEncoding.EncodedLen(len(op.value)) + len(op.meta) + 96
			if len(puts) > 0 && (len(puts) >= bulkMaxItems || putBytes+size > bulkMaxBytes) {
				more = true
				continue
			}
			putBytes += size
			puts = append(puts, item{key: key, op: op, st: st})
		}
		st.pending = nil
		st.inflight = true
	}
	return puts, dels, next, more, false
}

// complete ends a round for it: err (nil = written) goes to every waiter.
func (w *writer) complete(it item, err error) {
	if err != nil && w.ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	it.st.inflight = false
	it.st.last = time.Now()
	for _, ch := range it.op.waiters {
		ch <- err
	}
}

// retry puts an op a bulk request reported unsuccessful back in line,
// merged with any newer op of the key, or fails it after MaxRetries rounds.
func (w *writer) retry(it item, what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	it.st.inflight = false
	it.st.last = time.Now()
	it.op.tries++
	if it.op.tries > w.s.cfg.MaxRetries || w.ctx.Err() != nil {
		err := fmt.Errorf("cfkv: %s %q: reported unsuccessful %d times: %w", what, it.key, it.op.tries, storage.ErrUnavailable)
		for _, ch := range it.op.waiters {
			ch <- err
		}
		return
	}
	if p := it.st.pending; p != nil {
		p.waiters = append(it.op.waiters, p.waiters...)
		return
	}
	it.st.pending = it.op
	w.signal()
}

func (w *writer) flushPuts(items []item) {
	switch len(items) {
	case 0:
		return
	case 1:
		w.complete(items[0], w.s.putOne(w.ctx, items[0].key, items[0].op))
		return
	}
	failed, err := w.s.putBulk(w.ctx, items)
	for _, it := range items {
		switch {
		case err != nil:
			w.complete(it, err)
		case failed[it.key]:
			w.retry(it, "bulk write")
		default:
			w.complete(it, nil)
		}
	}
}

func (w *writer) flushDels(items []item) {
	switch len(items) {
	case 0:
		return
	case 1:
		w.complete(items[0], w.s.deleteOne(w.ctx, items[0].key))
		return
	}
	failed, err := w.s.deleteBulk(w.ctx, items)
	for _, it := range items {
		switch {
		case err != nil:
			w.complete(it, err)
		case failed[it.key]:
			w.retry(it, "bulk delete")
		default:
			w.complete(it, nil)
		}
	}
}

// close stops accepting writes, lets the flusher send what is pending for
// up to timeout, then cancels it and fails what is left with ErrClosed.
func (w *writer) close(timeout time.Duration) error {
	w.mu.Lock()
	w.closing.Store(true)
	w.mu.Unlock()
	w.signal()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		w.cancel()
		<-w.done
	}
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	dropped := 0
	for _, st := range w.keys {
		if st.pending == nil {
			continue
		}
		dropped++
		for _, ch := range st.pending.waiters {
			ch <- ErrClosed
		}
		st.pending = nil
	}
	if dropped > 0 {
		return fmt.Errorf("cfkv: close: %d pending writes were not sent within %s: %w", dropped, timeout, ErrClosed)
	}
	return nil
}

// ttlSeconds is the expiration_ttl to send, or 0.
func (s *Store) ttlSeconds() float64 {
	return math.Floor(s.cfg.ExpirationTTL.Seconds())
}

// putOne writes one value with PUT …/values/{key}. The body is the value's
// bytes (or a multipart form with "value" and "metadata"), passed with
// option.WithRequestBody: cloudflare-go v4's generated Update would send
// {"value":"…"} JSON, which KV stores as the value (cloudflare-go#3911).
func (s *Store) putOne(ctx context.Context, key string, op *writeOp) error {
	params := kv.NamespaceValueUpdateParams{AccountID: cloudflare.F(s.cfg.AccountID)}
	if ttl := s.ttlSeconds(); ttl > 0 {
		params.ExpirationTTL = cloudflare.F(ttl)
	}
	ctype, body := "application/octet-stream", op.value
	if op.meta != nil {
		ctype, body = multipartBody(op.value, op.meta)
	}
	return s.call(ctx, "put", key, func(ctx context.Context, opts ...option.RequestOption) error {
		opts = append([]option.RequestOption{option.WithRequestBody(ctype, body)}, opts...)
		_, err := s.nsvc.Values.Update(ctx, s.cfg.NamespaceID, escapeKey(key), params, opts...)
		return err
	})
}

// multipartBody builds the form KV accepts for a value with metadata.
func multipartBody(value []byte, meta json.RawMessage) (string, []byte) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormField("value") // writes to a bytes.Buffer cannot fail
	_, _ = fw.Write(value)
	_ = mw.WriteField("metadata", string(meta))
	_ = mw.Close()
	return mw.FormDataContentType(), buf.Bytes()
}

// putBulk writes several values with one PUT …/bulk. Values travel base64
// encoded (the API's "base64": true), so any bytes round-trip. It returns
// the keys the API reported unsuccessful.
func (s *Store) putBulk(ctx context.Context, items []item) (map[string]bool, error) {
	body := make([]kv.NamespaceBulkUpdateParamsBody, len(items))
	ttl := s.ttlSeconds()
	for i, it := range items {
		b := kv.NamespaceBulkUpdateParamsBody{
			Key:    cloudflare.F(it.key),
			Value:  cloudflare.F(base64.StdEncoding.EncodeToString(it.op.value)),
			Base64: cloudflare.F(true),
		}
		if ttl > 0 {
			b.ExpirationTTL = cloudflare.F(ttl)
		}
		if it.op.meta != nil {
			b.Metadata = cloudflare.F[any](it.op.meta)
		}
		body[i] = b
	}
	var failed map[string]bool
	err := s.call(ctx, "bulk write", fmt.Sprintf("%d keys", len(items)), func(ctx context.Context, opts ...option.RequestOption) error {
		res, err := s.nsvc.BulkUpdate(ctx, s.cfg.NamespaceID, kv.NamespaceBulkUpdateParams{
			AccountID: cloudflare.F(s.cfg.AccountID),
			Body:      body,
		}, opts...)
		if err != nil {
			return err
		}
		failed = toSet(res.UnsuccessfulKeys)
		return nil
	})
	return failed, err
}

// deleteOne removes one key; a 404 counts as deleted.
func (s *Store) deleteOne(ctx context.Context, key string) error {
	err := s.call(ctx, "delete", key, func(ctx context.Context, opts ...option.RequestOption) error {
		_, err := s.nsvc.Values.Delete(ctx, s.cfg.NamespaceID, escapeKey(key),
			kv.NamespaceValueDeleteParams{AccountID: cloudflare.F(s.cfg.AccountID)}, opts...)
		return err
	})
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	return err
}

// deleteBulk removes several keys with one POST …/bulk/delete.
func (s *Store) deleteBulk(ctx context.Context, items []item) (map[string]bool, error) {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.key
	}
	var failed map[string]bool
	err := s.call(ctx, "bulk delete", fmt.Sprintf("%d keys", len(items)), func(ctx context.Context, opts ...option.RequestOption) error {
		res, err := s.nsvc.BulkDelete(ctx, s.cfg.NamespaceID, kv.NamespaceBulkDeleteParams{
			AccountID: cloudflare.F(s.cfg.AccountID),
			Body:      keys,
		}, opts...)
		if err != nil {
			return err
		}
		failed = toSet(res.UnsuccessfulKeys)
		return nil
	})
	return failed, err
}

func toSet(keys []string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}
