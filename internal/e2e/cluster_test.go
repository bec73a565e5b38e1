package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/storage/natsstore"
)

// clusterFromDeployConfig starts a 3-node cluster on loopback from the
// shipped deploy/nats/cluster/node.conf (its accounts and per-role users
// included), each node configured through the environment as the file
// says. It uses t.Setenv: the caller must not be parallel.
func clusterFromDeployConfig(t testing.TB) (*natstest.Cluster, func(t testing.TB, role string) *nats.Conn) {
	for _, role := range []string{"DISPATCHER", "WORKER", "PRODUCER", "SUBSCRIBER", "CLIENT", "SYS"} {
		t.Setenv("FLEET_"+role+"_PASSWORD", "pw-"+role)
	}
	ports := natstest.FreePorts(t, 9)
	for i := range 3 {
		t.Setenv("FLEET_NATS_ROUTE_"+strconv.Itoa(i+1), "nats-route://127.0.0.1:"+strconv.Itoa(ports[6+i]))
	}
	var opts []*server.Options
	for i := range 3 {
		t.Setenv("FLEET_NATS_NAME", "fleet-nats-"+strconv.Itoa(i+1))
		t.Setenv("FLEET_NATS_HOST", "127.0.0.1")
		t.Setenv("FLEET_NATS_PORT", strconv.Itoa(ports[i]))
		t.Setenv("FLEET_NATS_HTTP_PORT", strconv.Itoa(ports[3+i]))
		t.Setenv("FLEET_NATS_CLUSTER_PORT", strconv.Itoa(ports[6+i]))
		t.Setenv("FLEET_NATS_STORE", t.TempDir())
		o, err := server.ProcessConfigFile("../../deploy/nats/cluster/node.conf")
		require.NoError(t, err)
		o.NoLog = true
		opts = append(opts, o)
	}
	c := natstest.RunCluster(t, opts)
	connect := func(t testing.TB, role string) *nats.Conn {
		nc, err := nats.Connect(c.URLs(), nats.UserInfo(role, "pw-"+strings.ToUpper(role)),
			nats.CustomInboxPrefix("_INBOX_"+role), nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	return c, connect
}

// The fleet on a 3-node cluster (R3 streams) from the shipped config: the
// leader of FLEET_QUERIES, then of FLEET_JOBS, then of the work consumer
// is killed while jobs run, and restarted once jobs finish again. Every
// job runs exactly once and ends with exactly one terminal status, with
// contiguous Fleet-Seq and a transcript equal to the stream. The
// stall after each kill (time to the next finished job) is logged;
// BenchmarkClusterFailover measures it over many kills.
func TestClusterLeaderFailover(t *testing.T) {
	stalls := failover(t, 1)
	for kind, d := range stalls {
		t.Logf("killed the %s leader: the first job finished %s later", kind, d[0].Round(time.Millisecond))
	}
}

// BenchmarkClusterFailover (make bench/failover) kills each kind of leader
// FLEET_FAILOVER_KILLS times (default 10) and prints, per kind, the p50 and
// max of the stall: the time from the kill to the next finished job, with
// jobs (12 lines over 1.2 s, 6 slots) running throughout.
func BenchmarkClusterFailover(b *testing.B) {
	kills := 10
	if n, err := strconv.Atoi(os.Getenv("FLEET_FAILOVER_KILLS")); err == nil && n > 0 {
		kills = n
	}
	for range b.N {
		stalls := failover(b, kills)
		for _, kind := range []string{"FLEET_QUERIES", "FLEET_JOBS", "consumer"} {
			d := stalls[kind]
			slices.Sort(d)
			fmt.Printf("failover_stall_%s_p50_ms %d ms\nfailover_stall_%s_max_ms %d ms\n",
				strings.ToLower(kind), d[len(d)/2].Milliseconds(), strings.ToLower(kind), d[len(d)-1].Milliseconds())
		}
	}
}

// failover runs waves of jobs on a 3-node cluster, killing one leader per
// wave (FLEET_QUERIES, FLEET_JOBS, the consumer, in turn, rounds times),
// checks every job, and returns the stalls by kind.
func failover(t testing.TB, rounds int) map[string][]time.Duration {
	c, connect := clusterFromDeployConfig(t)
	f := fleettest.New(t, fleettest.Opts{Server: c.Servers()[0], Connect: connect, Replicas: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds)*5*time.Minute)
	defer cancel()

	var mu sync.Mutex
	runs := map[string]int{}
	hooks := func(cfg *worker.Config) {
		cfg.Test.RunStarted = func(_, id string, _ int) {
			mu.Lock()
			runs[id]++
			mu.Unlock()
		}
	}
	var workers []*fleettest.Worker
	for range 3 {
		w := f.StartWorker(fleettest.WorkerOpts{Slots: 2, Mod: hooks})
		workers = append(workers, w)
	}
	for _, w := range workers {
		fleettest.WaitReady(t, w.W)
	}

	// Every terminal status, as it happens.
	done := make(chan string, 256)
	obs := connect(t, "client")
	sub, err := obs.Subscribe(f.Names.StatusWildcard(), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.State.Terminal() {
			done <- ev.ID
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, obs.Flush())

	leader := func(kind string) string {
		var name string
		fleettest.Eventually(t, time.Minute, func() bool {
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if kind == "consumer" {
				cons, err := f.JS.Consumer(lctx, f.Names.JobsStream(), f.Names.Consumer())
				if err != nil {
					return false
				}
				info, err := cons.Info(lctx)
				if err != nil || info.Cluster == nil {
					return false
				}
				name = info.Cluster.Leader
			} else {
				st, err := f.JS.Stream(lctx, kind)
				if err != nil {
					return false
				}
				info, err := st.Info(lctx)
				if err != nil || info.Cluster == nil {
					return false
				}
				name = info.Cluster.Leader
			}
			return name != ""
		}, kind+" leader")
		return name
	}

	stalls := map[string][]time.Duration{}
	var ids []string
	for round := range rounds {
		for _, kind := range []string{f.Names.QueriesStream(), f.Names.JobsStream(), "consumer"} {
			var batch []string
			for i := range 8 {
				id := fmt.Sprintf("fo-%d-%s-%d", round, strings.ToLower(kind), i)
				batch = append(batch, strings.ReplaceAll(id, "_", "-"))
				f.SubmitJSON("default", batch[i], "/standin lines=12 delay=100ms")
			}
			ids = append(ids, batch...)
			// Kill the leader while the wave runs.
			waitMsgs(t, ctx, f.JS, f.Names.QueryMsg("default", batch[0]), 3)
			name := leader(kind)
			node := c.Node(name)
			require.GreaterOrEqual(t, node, 0, "leader %q of %s", name, kind)
			killed := time.Now()
			c.Kill(node)
			finished := map[string]bool{}
			for len(finished) < len(batch) {
				select {
				case id := <-done:
					if slices.Contains(batch, id) && !finished[id] {
						if len(finished) == 0 {
							stalls[kind] = append(stalls[kind], time.Since(killed))
						}
						finished[id] = true
					}
				case <-ctx.Done():
					t.Fatalf("%s leader killed: %d of %d jobs finished", kind, len(finished), len(batch))
				}
			}
			c.Restart(node)
		}
	}

	for _, w := range workers {
		require.NoError(t, w.W.Stop(ctx))
	}
	for _, id := range ids {
		// A node restarted last may still be catching up, and the history
		// may be read there: wait until it shows the terminal status.
		var h fleettest.Run
		fleettest.Eventually(t, wait, func() bool {
			var err error
			h, err = f.TryHistory("default", id)
			return err == nil && h.Final != nil
		}, id+" history complete")
		fleettest.RequireOneTerminal(t, h)
		require.Equal(t, protocol.StateSucceeded, h.Final.State, id)
		lines := fleettest.RequireContiguous(t, h)
		require.Len(t, lines, 15, "%s: init, the stand-in's intro, 12 lines and the result, once", id)
		mu.Lock()
		require.Equal(t, 1, runs[id], "%s ran exactly once", id)
		mu.Unlock()
		for _, w := range workers {
			require.NoError(t, w.Journal.WaitPersisted(ctx, "default", id))
		}
		require.Equal(t, string(fleettest.JoinLines(lines)), string(f.Transcript(f.Objects, "default", id)), id)
	}
	return stalls
}

// With --storage nats:// on a 3-node cluster, the storage buckets follow
// the fleet's replicas: a bucket a worker made with one replica before the
// dispatcher started is raised to three, and when the node leading the
// transcripts bucket is killed, jobs keep finishing with their status
// records and transcripts stored while it is down. With one replica the
// buckets lived on one node, and its loss took every transcript and status
// write with it until it came back.
func TestNATSStorageSurvivesANodeLoss(t *testing.T) {
	c := natstest.RunCluster(t, natstest.ClusterOptions(t, 3))
	connect := func(t testing.TB, _ string) *nats.Conn {
		nc, _ := c.Connect(t, nats.RetryOnFailedConnect(true))
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A worker started first makes the objects bucket, with one replica.
	wjs, err := jetstream.New(connect(t, "worker"))
	require.NoError(t, err)
	// Retried as cmd/worker does: a young cluster may not place it yet.
	var first storage.Store
	require.NoError(t, provision.Retry(ctx, func(ctx context.Context) (err error) {
		first, err = backends.Open(ctx, "nats://", backends.Objects, backends.Deps{JS: wjs})
		return err
	}))
	require.NoError(t, first.Close())

	f := fleettest.New(t, fleettest.Opts{Server: c.Servers()[0], Connect: connect, Replicas: 3, StorageURL: "nats://"})
	streamInfo := func(name string) *jetstream.StreamInfo {
		t.Helper()
		var info *jetstream.StreamInfo
		fleettest.Eventually(t, time.Minute, func() bool {
			ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			st, err := f.JS.Stream(ictx, name)
			if err != nil {
				return false
			}
			info, err = st.Info(ictx)
			return err == nil && info.Cluster != nil && info.Cluster.Leader != ""
		}, name+" info")
		return info
	}
	objStream := "OBJ_" + f.Names.ObjectBucket()
	for _, name := range []string{"KV_" + f.Names.StatusBucket(), objStream, "KV_" + natsstore.NamesBucket(f.Names.ObjectBucket())} {
		require.Equal(t, 3, streamInfo(name).Config.Replicas, "%s follows the fleet's replicas", name)
	}

	var workers []*fleettest.Worker
	for range 2 {
		workers = append(workers, f.StartWorker(fleettest.WorkerOpts{Slots: 2}))
	}
	for _, w := range workers {
		fleettest.WaitReady(t, w.W)
	}

	leader := streamInfo(objStream).Cluster.Leader
	node := c.Node(leader)
	require.GreaterOrEqual(t, node, 0, "leader %q of %s", leader, objStream)
	c.Kill(node)
	t.Logf("killed %s, the leader of %s", leader, objStream)

	// Submitted as a producer does, again until acknowledged (the same
	// Nats-Msg-Id): the killed node may also have led FLEET_JOBS, and a
	// publish sent while it elects a new leader is never acknowledged.
	var ids []string
	for i := range 4 {
		id := "nodeloss-" + strconv.Itoa(i)
		ids = append(ids, id)
		body, err := json.Marshal(protocol.Job{ID: id, Prompt: "/standin lines=3"})
		require.NoError(t, err)
		fleettest.Eventually(t, 2*time.Minute, func() bool {
			m := nats.NewMsg(f.Names.JobSubject("default"))
			m.Data = body
			m.Header.Set(protocol.HeaderMsgID, id)
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := f.JS.PublishMsg(pctx, m)
			return err == nil
		}, id+" submitted")
	}
	for _, id := range ids {
		fleettest.Eventually(t, 2*time.Minute, func() bool {
			ev, err := storage.GetStatus(ctx, f.Status, "default", id)
			return err == nil && ev.State.Terminal()
		}, id+" status record stored")
		ev, err := storage.GetStatus(ctx, f.Status, "default", id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateSucceeded, ev.State, id)
		var h fleettest.Run
		fleettest.Eventually(t, time.Minute, func() bool {
			h, err = f.TryHistory("default", id)
			return err == nil && h.Final != nil
		}, id+" history")
		fleettest.RequireOneTerminal(t, h)
		lines := fleettest.RequireContiguous(t, h)
		require.Equal(t, string(fleettest.JoinLines(lines)), string(f.Transcript(f.Objects, "default", id)),
			"%s: the transcript is stored with %s down", id, leader)
	}
}
