package bench

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// floorLine is one of the three lines a floor job publishes: about the
// size of the stand-in's echo lines.
var floorLine = []byte(`{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"hi"}]},"session_id":"00000000-0000-0000-0000-000000000000"}`)

// floorResult is what the floor run cost per job.
type floorResult struct {
	nats, client    time.Duration // nats-server's CPU, the clients' (this process)
	natsIn, natsOut int64         // messages into and out of the server
	jobs            int
}

// jobFloor is the least any implementation of the fleet's job flow costs the
// server, measured on the fleet's own nats-server (the fleet idle): bare
// nats.go clients in this process exchange only the messages a job needs,
// and nothing else. A producer publishes each job to a work-queue stream;
// slots worker loops, fed by one pull consumer, publish a "running"
// status, three lines (asynchronously) and a "succeeded" status to a
// stream configured like FLEET_QUERIES, then ack the job; a durable
// consumer reads and acks every status (the status index). Jobs are
// submitted as the fleet's are in the dispatch benchmark. Left out, so
// the figure is a floor: the agent's start, admission (the job's move
// from fleet.jobs to fleet.work), the fence's checks and claim reads, the
// archiver, heartbeats, and every storage write.
func jobFloor(t testing.TB, fp *fleetProcs, jobs, slots int) (r floorResult) {
	r.jobs = jobs
	ctx := context.Background()
	connect := func() jetstream.JetStream {
		nc, err := nats.Connect(fp.nc.ConnectedUrl())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
		require.NoError(t, err)
		return js
	}
	producer, worker, reader := connect(), connect(), connect()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "FLOOR_JOBS", Subjects: []string{"floor.work.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage},
		{Name: "FLOOR_QUERIES", Subjects: []string{"floor.query.>"}, Storage: jetstream.FileStorage,
			MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute, AllowDirect: true},
	} {
		_, err := producer.CreateOrUpdateStream(ctx, cfg)
		require.NoError(t, err)
		defer func() { require.NoError(t, producer.DeleteStream(ctx, cfg.Name)) }()
	}
	wc, err := worker.CreateOrUpdateConsumer(ctx, "FLOOR_JOBS", jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: slots, AckWait: time.Minute})
	require.NoError(t, err)
	sc, err := reader.CreateOrUpdateConsumer(ctx, "FLOOR_QUERIES", jetstream.ConsumerConfig{
		Durable: "status", FilterSubject: "floor.query.*.*.status", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024})
	require.NoError(t, err)

	var finished atomic.Int64
	done := make(chan struct{})
	scc, err := sc.Consume(func(m jetstream.Msg) {
		if bytes.Contains(m.Data(), []byte(`"succeeded"`)) && finished.Add(1) == int64(jobs) {
			close(done)
		}
		_ = m.Ack()
	})
	require.NoError(t, err)
	defer scc.Stop()

	// The first failure of any worker loop (atomic.Value would panic on a
	// second error of another type).
	var (
		failMu sync.Mutex
		failed error
	)
	fail := func(err error) {
		failMu.Lock()
		defer failMu.Unlock()
		if failed == nil {
			failed = err
		}
	}
	work := make(chan jetstream.Msg, slots)
	var wg sync.WaitGroup
	for range slots {
		wg.Go(func() {
			for m := range work {
				q := "floor.query.default." + string(m.Data())
				_, err := worker.Publish(ctx, q+".status", []byte(`{"state":"running"}`))
				fail(err)
				var acks [3]jetstream.PubAckFuture
				for i := range acks {
					acks[i], err = worker.PublishAsync(q+".msg", floorLine)
					fail(err)
				}
				for _, a := range acks {
					if a == nil {
						continue
					}
					select {
					case <-a.Ok():
					case err := <-a.Err():
						fail(err)
					}
				}
				_, err = worker.Publish(ctx, q+".status", []byte(`{"state":"succeeded"}`))
				fail(err)
				fail(m.Ack())
			}
		})
	}
	wcc, err := wc.Consume(func(m jetstream.Msg) { work <- m }, jetstream.PullMaxMessages(slots))
	require.NoError(t, err)

	in0, out0 := fp.natsMsgs(t)
	n0, h0 := procCPU(t, fp.nats.Process.Pid), cpuTime(t)
	for i := range jobs {
		// As fleetProcs.submit does: one synchronous publish per job.
		m := nats.NewMsg("floor.work.default")
		m.Data = []byte("f" + strconv.Itoa(i))
		m.Header.Set(jetstream.MsgIDHeader, string(m.Data))
		_, err := producer.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		t.Fatalf("floor: %d of %d jobs finished in 10 minutes", finished.Load(), jobs)
	}
	n1, h1 := procCPU(t, fp.nats.Process.Pid), cpuTime(t)
	in1, out1 := fp.natsMsgs(t)
	wcc.Stop()
	close(work)
	wg.Wait()
	if failed != nil {
		t.Fatalf("floor: %v", failed)
	}
	r.nats, r.client = n1-n0, h1-h0
	r.natsIn, r.natsOut = in1-in0, out1-out0
	return r
}
