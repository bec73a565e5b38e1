package startstop

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// svc is the smallest service: it counts its starts and stops.
type svc struct {
	Base
	starts, stops int
	failStart     error
	stopErr       error
}

func (s *svc) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(context.Context) error {
		s.starts++
		return s.failStart
	})
}

func (s *svc) Stop(ctx context.Context) error {
	return s.Base.Stop(ctx, func(context.Context) error {
		s.stops++
		return s.stopErr
	})
}

var _ Service = (*svc)(nil)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestStartThenStop(t *testing.T) {
	s := &svc{}
	ctx := context.Background()
	if closed(s.Started()) || closed(s.Stopped()) {
		t.Fatal("a new service is neither started nor stopped")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(s.Started()) || !s.Running() {
		t.Fatal("Started not closed after Start")
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(s.Stopped()) || s.Running() || !s.Stopping() {
		t.Fatal("Stopped not closed after Stop")
	}
	if s.starts != 1 || s.stops != 1 {
		t.Fatalf("starts %d stops %d, want 1 and 1", s.starts, s.stops)
	}
}

func TestSecondStartIsRefused(t *testing.T) {
	s := &svc{Base: Base{Name: "svc"}}
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	err := s.Start(ctx)
	if !errors.Is(err, ErrAlreadyStarted) || err.Error() != "svc: already started" {
		t.Fatalf("second Start: %v", err)
	}
	if s.starts != 1 {
		t.Fatalf("start ran %d times", s.starts)
	}
	_ = s.Stop(ctx)
}

func TestStartAfterStopIsRefused(t *testing.T) {
	s := &svc{}
	ctx := context.Background()
	_ = s.Start(ctx)
	_ = s.Stop(ctx)
	if err := s.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop: %v", err)
	}
	if s.starts != 1 {
		t.Fatalf("start ran %d times", s.starts)
	}
}

func TestStopBeforeStartRunsNothing(t *testing.T) {
	s := &svc{}
	ctx := context.Background()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s.stops != 0 || !closed(s.Stopped()) {
		t.Fatalf("stops %d, stopped %v", s.stops, closed(s.Stopped()))
	}
	if err := s.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after an early Stop: %v", err)
	}
}

func TestFailedStartMayBeRetried(t *testing.T) {
	boom := errors.New("boom")
	s := &svc{failStart: boom}
	ctx := context.Background()
	if err := s.Start(ctx); !errors.Is(err, boom) {
		t.Fatalf("Start: %v", err)
	}
	if closed(s.Started()) || s.Running() {
		t.Fatal("a failed Start left the service started")
	}
	s.failStart = nil
	if err := s.Start(ctx); err != nil {
		t.Fatalf("retried Start: %v", err)
	}
	if s.starts != 2 {
		t.Fatalf("starts %d", s.starts)
	}
	_ = s.Stop(ctx)
}

func TestSecondStopReturnsTheFirstsResult(t *testing.T) {
	boom := errors.New("still draining")
	s := &svc{stopErr: boom}
	ctx := context.Background()
	_ = s.Start(ctx)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Stop(ctx) }()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, boom) {
			t.Fatalf("Stop %d: %v", i, err)
		}
	}
	if s.stops != 1 {
		t.Fatalf("stop ran %d times", s.stops)
	}
}

func TestStopWaitsForAStartUnderWay(t *testing.T) {
	s := &Base{}
	inStart, release := make(chan struct{}), make(chan struct{})
	startErr := make(chan error, 1)
	go func() {
		startErr <- s.Start(context.Background(), func(context.Context) error {
			close(inStart)
			<-release
			return nil
		})
	}()
	<-inStart
	stopRan := make(chan struct{})
	stopErr := make(chan error, 1)
	go func() {
		stopErr <- s.Stop(context.Background(), func(context.Context) error { close(stopRan); return nil })
	}()
	close(release)
	if err := <-startErr; err != nil {
		t.Fatal(err)
	}
	if err := <-stopErr; err != nil {
		t.Fatal(err)
	}
	if !closed(stopRan) {
		t.Fatal("a Stop that raced Start did not stop what Start began")
	}
}
