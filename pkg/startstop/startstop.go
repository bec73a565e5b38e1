package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

var (
	// ErrAlreadyStarted is returned by a second Start of a running service.
	ErrAlreadyStarted = errors.New("already started")
	// ErrStopped is returned by Start after Stop.
	ErrStopped = errors.New("stopped; a stopped service does not start again")
)

// Service is what every long-lived service of the fleet offers its owner.
type Service interface {
	// Start begins serving; it returns once the service serves or failed
	// to.
	Start(ctx context.Context) error
	// Stop stops serving; ctx bounds how long it waits for work under way.
	Stop(ctx context.Context) error
	// Started is closed once Start succeeded.
	Started() <-chan struct{}
	// Stopped is closed once Stop finished.
	Stopped() <-chan struct{}
}

type state int

const (
	stateNew state = iota
	stateRunning
	stateStopped
)

// Base carries one service's lifecycle. The zero value is ready to use;
// Name, when set, prefixes the errors Base returns. A Base must not be
// copied after first use.
type Base struct {
	Name string

	// lifecycle serialises Start and Stop, so a Stop waits for a Start
	// under way and the work of each never overlaps.
	lifecycle sync.Mutex

	mu       sync.Mutex
	state    state
	started  chan struct{}
	stopped  chan struct{}
	stopDone bool
	stopErr  error
}

func (b *Base) chans() (started, stopped chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started == nil {
		b.started, b.stopped = make(chan struct{}), make(chan struct{})
	}
	return b.started, b.stopped
}

func (b *Base) wrap(err error) error {
	if b.Name == "" {
		return err
	}
	return fmt.Errorf("%s: %w", b.Name, err)
}

// Start runs start if the service is new. A start that fails leaves the
// service new; one that succeeds makes it running and closes Started.
func (b *Base) Start(ctx context.Context, start func(ctx context.Context) error) error {
	b.lifecycle.Lock()
	defer b.lifecycle.Unlock()
	started, _ := b.chans()
	b.mu.Lock()
	st := b.state
	b.mu.Unlock()
	switch st {
	case stateRunning:
		return b.wrap(ErrAlreadyStarted)
	case stateStopped:
		return b.wrap(ErrStopped)
	}
	if start != nil {
		if err := start(ctx); err != nil {
			return err
		}
	}
	b.mu.Lock()
	b.state = stateRunning
	b.mu.Unlock()
	close(started)
	return nil
}

// Stop runs stop once, if the service was started, and closes Stopped.
// Before Start it only marks the service stopped. A later Stop returns the
// first one's result.
func (b *Base) Stop(ctx context.Context, stop func(ctx context.Context) error) error {
	b.lifecycle.Lock()
	defer b.lifecycle.Unlock()
	_, stopped := b.chans()
	b.mu.Lock()
	if b.stopDone {
		err := b.stopErr
		b.mu.Unlock()
		return err
	}
	wasRunning := b.state == stateRunning
	b.state = stateStopped
	b.mu.Unlock()
	var err error
	if wasRunning && stop != nil {
		err = stop(ctx)
	}
	b.mu.Lock()
	b.stopDone, b.stopErr = true, err
	b.mu.Unlock()
	close(stopped)
	return err
}

// Started is closed once Start succeeded.
func (b *Base) Started() <-chan struct{} {
	started, _ := b.chans()
	return started
}

// Stopped is closed once Stop finished.
func (b *Base) Stopped() <-chan struct{} {
	_, stopped := b.chans()
	return stopped
}

// Running reports whether the service started and has not begun to stop.
func (b *Base) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == stateRunning
}

// Stopping reports whether Stop has been called (it may still be running).
func (b *Base) Stopping() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == stateStopped
}
