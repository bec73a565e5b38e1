package tenancy_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A tenant's message id lives in its own namespace: another tenant
// publishing first with it does not make the job a duplicate, the
// tenant's own retry is one, and a job with a key protocol.Job does not
// have is refused with a reply naming it.
func TestTenantSubmitDedupe(t *testing.T) {
	s := newSetup(t)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	a := jsOf(t, s.connect(s.creds("a", 0), nil))
	b := jsOf(t, s.connect(s.creds("b", 0), nil))
	pub := func(js jetstream.JetStream, tenant, id, msgID string) (*jetstream.PubAck, error) {
		return js.PublishMsg(ctxT(t, 30*time.Second), &nats.Msg{Subject: "fleet.jobs." + tenant,
			Data: []byte(`{"id":"` + id + `","prompt":"hello"}`), Header: nats.Header{protocol.HeaderMsgID: []string{msgID}}})
	}
	// b goes first with a's ids, both as a sends them and bare.
	for _, id := range []string{"a.q1", "q2"} {
		ack, err := pub(b, "b", "stolen", id)
		require.NoError(t, err)
		require.False(t, ack.Duplicate)
	}
	ack, err := pub(a, "a", "q1", "a.q1")
	require.NoError(t, err)
	require.False(t, ack.Duplicate, "b's publish made a's job a duplicate")
	ack, err = pub(a, "a", "q2", "q2")
	require.NoError(t, err)
	require.False(t, ack.Duplicate, "b's publish made a's job a duplicate")
	ack, err = pub(a, "a", "q1", "a.q1")
	require.NoError(t, err)
	require.True(t, ack.Duplicate, "a's own retry was not deduplicated")

	// The job stored is the one the dispatcher built: a's, with its id.
	jobs, err := f.JS.Stream(ctxT(t, 10*time.Second), "FLEET_JOBS")
	require.NoError(t, err)
	_ = jobs

	for _, body := range []string{`{"id":"q3","prompt":"p","evil":1}`, `{"id":"q3","prompt":"p","Prompt":"q"}`, `{"id":"q3","prompt":"p","ſandbox":"local"}`, `{"id":"q3","prompt":"p","tenant":"b"}`} {
		_, err := a.Publish(ctxT(t, 30*time.Second), "fleet.jobs.a", []byte(body))
		require.Error(t, err, body)
	}
	_, err = a.Publish(ctxT(t, 30*time.Second), "fleet.jobs.a", []byte(`{"id":"q3","prompt":"p","evil":1}`))
	require.ErrorContains(t, err, `"evil": unknown field`)
	// Fields only the fleet sets: a tenant cannot pass its job off as a
	// schedule's, nor hand a worker a git token.
	_, err = a.Publish(ctxT(t, 30*time.Second), "fleet.jobs.a", []byte(`{"id":"q4","prompt":"p","trigger":{"kind":"github","url":"https://x"}}`))
	require.ErrorContains(t, err, "trigger")
	_, err = a.Publish(ctxT(t, 30*time.Second), "fleet.jobs.a", []byte(`{"id":"q5","prompt":"p","workspace":{"repo":"https://git.example.com/r.git","token":"ghs_x"}}`))
	require.ErrorContains(t, err, "workspace.token")
}
