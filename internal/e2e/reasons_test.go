package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

// A job for a provider no worker has fails at once, on its first attempt,
// with a status that names the provider; a provider another worker has
// (--other-sandboxes) is handed back to it.
func TestJobNoWorkerCanRunFailsAtOnceWithItsReason(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)

	b, err := json.Marshal(protocol.Job{ID: "no-cf", Prompt: "x", Sandbox: protocol.SandboxCloudflare})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "no-cf", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, 1, r.Final.Attempt, "failed on its first delivery, not after max_deliveries")
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeSpawnFailed, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, `sandbox "cloudflare" is not configured on this worker`)
	for _, ev := range r.Statuses {
		require.NotEqual(t, protocol.StateRetrying, ev.State, "never retried")
	}
	res, err := protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data).AsResult()
	require.NoError(t, err, "the stream still ends with a result line")
	require.Equal(t, protocol.ReasonSpawnFailed, res.XFleet.Reason)

	// With --other-sandboxes cloudflare the same job waits for a worker
	// that has the provider, and runs there.
	g := fleettest.New(t, fleettest.Opts{})
	local := g.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.OtherSandboxes = []string{protocol.SandboxCloudflare}
	}})
	fleettest.WaitReady(t, local.W)
	b, err = json.Marshal(protocol.Job{ID: "elsewhere", Prompt: "x", Sandbox: protocol.SandboxCloudflare})
	require.NoError(t, err)
	g.PublishJob("default", b, nil)
	fake := bridgefake.New(t, bridgefake.Options{})
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client()})
	require.NoError(t, err)
	remote := g.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxCloudflare] = cf
	}})
	fleettest.WaitReady(t, remote.W)
	require.Equal(t, protocol.StateSucceeded, g.Follow("default", "elsewhere", wait).Final.State)
}

// A job body nobody can read (not JSON; JSON without an id) is terminated
// once and lands in the dead-letter stream with its reason, where
// `dispatcher ls --dlq` shows it.
func TestUnreadableJobsAreDeadLetteredAndListed(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()

	f.PublishJob("acme", []byte("this is not json"), nil)
	f.PublishJob("acme", []byte(`{"prompt":"no id here"}`), nil)
	f.SubmitJSON("acme", "fine-after", "x") // nothing wedges
	require.Equal(t, protocol.StateSucceeded, f.Follow("acme", "fine-after", wait).Final.State)

	var dls []protocol.DeadLetter
	fleettest.Eventually(t, wait, func() bool {
		code, out, errOut := runCLI(t, url, "", "ls", "--dlq", "--tenant", "acme", "--json")
		require.Equal(t, fleetcli.ExitOK, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &dls))
		return len(dls) == 2
	}, "two dead letters")
	// Newest first.
	require.Equal(t, `{"prompt":"no id here"}`, string(dls[0].Body))
	require.Equal(t, "this is not json", string(dls[1].Body))
	for _, d := range dls {
		require.Equal(t, "acme", d.Tenant)
		require.Equal(t, protocol.CodeInvalidJob, d.Reason)
		require.NotEmpty(t, d.Error, "the reason in words")
		require.NotZero(t, d.JobSeq)
	}
	require.Contains(t, dls[0].Error, "id")

	code, out, errOut := runCLI(t, url, "", "ls", "--dlq", "-A")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "REASON")
	require.Contains(t, out, "invalid_job")
	require.Contains(t, out, `"this is not json"`)
	code, _, _ = runCLI(t, url, "", "ls", "--dlq", "--state", "failed")
	require.Equal(t, fleetcli.ExitUsage, code)

	js, err := f.JS.Stream(context.Background(), f.Names.JobsStream())
	require.NoError(t, err)
	info, err := js.Info(context.Background())
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "nothing left in the work queue")
}

// A job published on a subject that names no valid tenant is dead-lettered
// apart from every tenant's (under _invalid, not default), and its reason
// names the subject its producer used, not the admitted copy's.
func TestAJobOnAnInvalidTenantSubjectIsRefusedNamingItsSubject(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	for _, subj := range []string{f.Names.Prefix() + ".jobs.Acme", f.Names.Prefix() + ".jobs.acme.team"} {
		m := nats.NewMsg(subj)
		m.Data = []byte(`{"id":"bad-subject","prompt":"hi"}`)
		_, err := f.JS.PublishMsg(context.Background(), m)
		require.NoError(t, err)
	}
	var dls []protocol.DeadLetter
	fleettest.Eventually(t, wait, func() bool {
		code, out, errOut := runCLI(t, url, "", "ls", "--dlq", "-A", "--json")
		require.Equal(t, fleetcli.ExitOK, code, errOut)
		var all []protocol.DeadLetter
		require.NoError(t, json.Unmarshal([]byte(out), &all))
		dls = dls[:0]
		for _, d := range all {
			require.Equal(t, protocol.InvalidTenantDLQ, d.Tenant, "dead-lettered apart from every tenant's: %+v", d)
			dls = append(dls, d)
		}
		return len(dls) == 2
	}, "two dead letters under "+protocol.InvalidTenantDLQ)
	named := map[string]bool{}
	for _, d := range dls {
		require.Equal(t, protocol.CodeInvalidJob, d.Reason)
		require.NotContains(t, d.Error, ".work.", "the admitted copy's subject is not the producer's")
		for _, subj := range []string{f.Names.Prefix() + ".jobs.acme.team", f.Names.Prefix() + ".jobs.Acme"} {
			if strings.Contains(d.Error, "the job came on "+subj+",") {
				named[subj] = true
			}
		}
	}
	require.Len(t, named, 2, "each reason names the subject its job came on: %+v", dls)
	code, out, errOut := runCLI(t, url, "", "ls", "--dlq", "--tenant", "default", "--json")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.JSONEq(t, "[]", strings.TrimSpace(out), "nothing under the default tenant")
}

// The agent's stderr is the reason when it exits without a result (Claude
// Code refusing --dangerously-skip-permissions as root): submit --follow
// and status show it, and the failed status's message quotes its last line.
func TestAgentStderrReachesFollowAndStatus(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	const said = "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons"
	prompt := "/standin say=starting say=" + strings.ReplaceAll(said, " ", "_") + " noresult=1 exit=1"

	code, out, errOut := runCLI(t, url, "", "submit", "--id", "stderr-1", "--follow", prompt)
	require.Equal(t, fleetcli.ExitFailed, code, errOut)
	require.Contains(t, out, "✗ failed (worker: process_exit)")
	require.Contains(t, out, "agent stderr:\n  | starting\n  | "+said+"\n")
	require.Contains(t, out, "[status] failed · attempt 1")
	require.Contains(t, out, "stderr: "+said, "the [status] line quotes it too")

	code, out, errOut = runCLI(t, url, "", "status", "stderr-1", "--json=false")
	require.Equal(t, fleetcli.ExitFailed, code, errOut)
	require.Contains(t, out, "error: process_exit: ")
	require.Contains(t, out, "agent stderr:\n  | starting\n  | "+said+"\n")

	code, out, errOut = runCLI(t, url, "", "status", "stderr-1")
	require.Equal(t, fleetcli.ExitFailed, code, errOut)
	var ev protocol.StatusEvent
	require.NoError(t, json.Unmarshal([]byte(out), &ev))
	require.Equal(t, "starting\n"+said+"\n", ev.Result.StderrTail)
	require.Contains(t, ev.Error.Message, "stderr: "+said)
}

// A cancel of a job still waiting for a slot ends it at once: status and
// ls say cancelled right away, the stream ends with the synthetic result,
// and no worker ever starts it.
func TestCancelOfAQueuedJobShowsCancelledAtOnce(t *testing.T) {
	t.Parallel()
	f, started := busyFleet(t, "busy")
	url := f.Srv.ClientURL()

	code, _, errOut := runCLI(t, url, "", "submit", "--id", "waiting", "never runs")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	code, _, errOut = runCLI(t, url, "", "cancel", "waiting")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, errOut, "default/waiting cancelled (it was still queued)")

	// At once: the only slot is still busy.
	code, out, errOut := runCLI(t, url, "", "status", "waiting")
	require.Equal(t, fleetcli.ExitCancelled, code, errOut)
	require.Contains(t, out, `"state": "cancelled"`)
	r := f.Follow("default", "waiting", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	require.Equal(t, protocol.CodeCancelled, r.Final.Error.Code)
	require.Len(t, r.Lines, 1, "only the synthetic result: the agent never started")
	res, err := protocol.ParseMessage(r.Lines[0].Data).AsResult()
	require.NoError(t, err)
	require.Equal(t, protocol.ReasonCancelled, res.XFleet.Reason)
	require.Equal(t, string(r.Lines[0].Data)+"\n", string(f.Transcript(f.Objects, "default", "waiting")))
	fleettest.Eventually(t, wait, func() bool {
		_, out, _ := runCLI(t, url, "", "ls", "--state", "cancelled")
		return strings.Contains(out, "waiting")
	}, "ls shows it cancelled")

	// Free the slot: the next job runs, "waiting" never does, and it keeps
	// its one terminal status.
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "busy"), []byte(`{"op":"cancel"}`)))
	require.Equal(t, protocol.StateCancelled, f.Follow("default", "busy", wait).Final.State)
	f.SubmitJSON("default", "after", "x")
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "after", wait).Final.State)
	require.Equal(t, "after", <-started, "the cancelled job was never started")
	qs, err := f.JS.Stream(context.Background(), f.Names.QueriesStream())
	require.NoError(t, err)
	subj := f.Names.QueryStatus("default", "waiting")
	info, err := qs.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	require.NoError(t, err)
	require.Equal(t, uint64(2), info.State.Subjects[subj], "queued, then the one terminal status")
	subj = f.Names.QueryMsg("default", "waiting")
	info, err = qs.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Subjects[subj], "one result line")
}

// A job published straight to the queue has no status until a worker
// takes it, so `dispatcher cancel` finds no query on record; it records
// the cancel anyway (saying so, exit 3), and the job never starts. Before,
// the CLI refused and sent nothing (found by QA).
func TestCLICancelOfADirectlyPublishedWaitingJob(t *testing.T) {
	t.Parallel()
	f, started := busyFleet(t, "busy-d")
	url := f.Srv.ClientURL()
	f.SubmitJSON("default", "direct", "never runs")

	code, _, errOut := runCLI(t, url, "", "cancel", "direct")
	require.Equal(t, fleetcli.ExitNotFound, code, errOut)
	require.Contains(t, errOut, "the cancel is recorded anyway")

	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "busy-d"), []byte(`{"op":"cancel"}`)))
	r := f.Follow("default", "direct", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	require.Len(t, r.Lines, 1, "only the synthetic result: the agent never started")
	f.SubmitJSON("default", "after-d", "x")
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "after-d", wait).Final.State)
	require.Equal(t, "after-d", <-started, "the cancelled job was never started")
}

// busyFleet is a fleet whose one worker slot is taken by busy (a stand-in
// that sleeps an hour until cancelled), and a channel that names each run
// as it starts (busy's start already taken from it).
func busyFleet(t *testing.T, busy string) (*fleettest.Fleet, chan string) {
	t.Helper()
	f, started := fleetWithRunStarted(t)
	f.SubmitJSON("default", busy, "/standin sleep=1h")
	require.Equal(t, busy, <-started)
	return f, started
}
