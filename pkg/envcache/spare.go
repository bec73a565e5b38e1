package envcache

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/keyqueue"
)

// Prepared copies live in <Dir>/spares/<key>/<random>, each a "files"
// directory laid out as it goes into a checkout and the entry's manifest;
// one being built is <Dir>/spares/<key>/.tmp-<random> until complete. A
// restore claims one by renaming it to <Dir>/.claimed-<random>.
const (
	sparesDir     = "spares"
	claimedPrefix = ".claimed-"
)

// ErrNoRoom is a preparation skipped because the copy would take the
// cache past Config.MaxBytes.
var ErrNoRoom = errors.New("envcache: no room for a prepared copy within the cache's bound")

// EventKind says what an Event is.
type EventKind int

const (
	// EventPrepared: a prepared copy of Key is ready.
	EventPrepared EventKind = iota + 1
	// EventPrepareFailed: preparing a copy of Key failed (Err says why:
	// ErrNoRoom, a full disk, the entry gone); restores of Key copy.
	EventPrepareFailed
	// EventSpareDropped: a claimed copy of Key did not match its
	// manifest (Err says how) and was removed, never served.
	EventSpareDropped
)

// Event is one thing the cache did in the background or instead of
// serving a prepared copy.
type Event struct {
	Kind  EventKind
	Key   string
	Took  time.Duration // EventPrepared: how long the copy took to make
	Files int           // EventPrepared: its files, links and directories
	Err   error
}

// preparer is the Cache's background work: a keyqueue.Queue whose one
// goroutine makes prepared copies of the keys it is asked for, one at a
// time, and the channel of events it reports on.
type preparer struct {
	keyqueue.Queue[struct{}]
	mu     sync.Mutex
	events chan Event
}

// Start begins preparing copies (nothing to do with Config.Spares
// NoSpares); Save and Restore ask for them from then on.
func (c *Cache) Start(ctx context.Context) error {
	return c.prep.Start(ctx, func(ctx context.Context, key string, _ struct{}) { c.prepareSpares(ctx, key) })
}

// Stop cancels the preparation under way (its temporary copy is removed)
// and waits for it, bounded by ctx. The Cache still saves and restores
// afterwards, by copying.
func (c *Cache) Stop(ctx context.Context) error {
	defer c.releaseOpenLock()
	if err := c.prep.Stop(ctx); err != nil {
		return fmt.Errorf("envcache: a preparation still running at stop: %w", err)
	}
	return nil
}

// Started is closed once Start succeeded.
func (c *Cache) Started() <-chan struct{} { return c.prep.Started() }

// Stopped is closed once Stop finished.
func (c *Cache) Stopped() <-chan struct{} { return c.prep.Stopped() }

// Events returns a channel of the cache's events (buffered; events are
// dropped when it is full). Call it before Start.
func (c *Cache) Events() <-chan Event {
	p := &c.prep
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.events == nil {
		p.events = make(chan Event, 256)
	}
	return p.events
}

func (p *preparer) emit(ev Event) {
	p.mu.Lock()
	ch := p.events
	p.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- ev:
	default:
	}
}

// want asks for key's prepared copies to be made up to Config.Spares.
// Nothing happens unless the cache is started.
func (c *Cache) want(key string) {
	if c.cfg.Spares > 0 {
		c.prep.Put(key, struct{}{})
	}
}

// prepareSpares makes key's prepared copies until there are
// Config.Spares, reporting each.
func (c *Cache) prepareSpares(ctx context.Context, key string) {
	for ctx.Err() == nil && len(c.spares(key)) < c.cfg.Spares {
		t0 := time.Now()
		files, err := c.prepare(ctx, key)
		if err != nil {
			if ctx.Err() == nil {
				c.prep.emit(Event{Kind: EventPrepareFailed, Key: key, Err: err})
			}
			return
		}
		c.prep.emit(Event{Kind: EventPrepared, Key: key, Took: time.Since(t0), Files: files})
	}
}

// prepare makes one prepared copy of key's entry: the entry's files
// placed as a restore would place them, under a temporary name, renamed
// into place once complete. It returns the number of items.
func (c *Cache) prepare(ctx context.Context, key string) (int, error) {
	unlock, err := c.lock(key, unix.LOCK_SH)
	if err != nil {
		return 0, err
	}
	defer unlock()
	dir := c.entry(key)
	manifest, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return 0, fmt.Errorf("envcache: preparing a copy: %w", err)
	}
	items, size, err := parseManifest(bufio.NewScanner(bytes.NewReader(manifest)))
	if err != nil {
		return 0, err
	}
	if err := verify(dir, items); err != nil {
		return 0, err
	}
	if total := c.usage(); total+size > c.cfg.MaxBytes {
		return 0, fmt.Errorf("%w: %d bytes used, %d more, at most %d", ErrNoRoom, total, size, c.cfg.MaxBytes)
	}
	keyDir := filepath.Join(c.cfg.Dir, sparesDir, key)
	tmp := filepath.Join(keyDir, ".tmp-"+random())
	defer os.RemoveAll(tmp) // gone once renamed; else a leftover Open removes
	if err := os.MkdirAll(filepath.Join(tmp, "files"), 0o700); err != nil {
		return 0, fmt.Errorf("envcache: preparing a copy: %w", err)
	}
	if _, err := restoreItems(ctx, dir, filepath.Join(tmp, "files"), items); err != nil {
		return 0, err
	}
	if err := writeSynced(filepath.Join(tmp, manifestFile), manifest); err != nil {
		return 0, fmt.Errorf("envcache: preparing a copy: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(keyDir, random())); err != nil {
		return 0, fmt.Errorf("envcache: preparing a copy: %w", err)
	}
	return len(items), nil
}

// spares lists the complete prepared copies of key.
func (c *Cache) spares(key string) []string {
	des, err := os.ReadDir(filepath.Join(c.cfg.Dir, sparesDir, key))
	if err != nil {
		return nil
	}
	var out []string
	for _, de := range des {
		if de.IsDir() && !strings.HasPrefix(de.Name(), ".") {
			out = append(out, filepath.Join(c.cfg.Dir, sparesDir, key, de.Name()))
		}
	}
	return out
}

// Spares is how many prepared copies of key are ready.
func (c *Cache) Spares(key string) int { return len(c.spares(key)) }

// claim takes one prepared copy of key for this restore alone (a rename
// out of the spares directory: two restores never get the same one) and
// returns where it now is; "" when there is none.
func (c *Cache) claim(key string) string {
	for _, s := range c.spares(key) {
		to := filepath.Join(c.cfg.Dir, claimedPrefix+random())
		if os.Rename(s, to) == nil {
			return to
		}
	}
	return ""
}

// dropSpares removes key's prepared copies (renamed away first).
func (c *Cache) dropSpares(key string) {
	trash := filepath.Join(c.cfg.Dir, ".trash-"+random())
	if os.Rename(filepath.Join(c.cfg.Dir, sparesDir, key), trash) == nil {
		_ = os.RemoveAll(trash)
	}
}

// usage is the bytes the entries and their prepared copies take (by
// their manifests).
func (c *Cache) usage() int64 {
	var total int64
	for _, e := range c.entries() {
		total += e.size * int64(1+e.spares)
	}
	return total
}

// restoreSpare serves a restore of key from a prepared copy when there is
// one on workdir's filesystem: claimed, checked against the entry's
// manifest and moved into workdir. ok false: none served (none ready,
// another filesystem, a copy that did not match, a move that failed);
// the caller copies, which also repairs a move that stopped half way.
func (c *Cache) restoreSpare(key, workdir string, manifest []byte, items []item) (res Result, ok bool) {
	if c.cfg.Spares == 0 || !sameDevice(c.cfg.Dir, workdir) {
		return Result{}, false
	}
	claimed := c.claim(key)
	if claimed == "" {
		return Result{}, false
	}
	defer os.RemoveAll(claimed) // what was not moved
	err := checkSpare(claimed, c.entry(key), manifest, items)
	if err == nil {
		err = moveInto(filepath.Join(claimed, "files"), workdir, items)
		if err == nil {
			res = Result{Hit: true, Prepared: true, Files: len(items)}
			for _, it := range items {
				res.Bytes += it.size
			}
			return res, true
		}
		err = fmt.Errorf("envcache: moving a prepared copy: %w", err)
	}
	c.prep.emit(Event{Kind: EventSpareDropped, Key: key, Err: err})
	return Result{}, false
}

// checkSpare checks a claimed copy: its manifest the entry's, its files
// exactly the manifest's, its links the entry's.
func checkSpare(dir, entry string, manifest []byte, items []item) error {
	own, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil || !bytes.Equal(own, manifest) {
		return fmt.Errorf("%w: a prepared copy's manifest is not its entry's", ErrCorrupt)
	}
	return verifyTree(filepath.Join(dir, "files"), filepath.Join(entry, "files"), items)
}

func sameDevice(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev
}
