package worker

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// The agent's model URL: contained with a network of its own, the
// forward's loopback address inside (the path kept); an open network or
// no containment, the model's own address; https is refused.
func TestAgentBaseURL(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      egress.Mode
		contained bool
		want      string
		forwards  int
	}{
		{"contained none", egress.None, true, "http://127.0.0.1:18080/v1/run-7", 1},
		{"contained allow", egress.Allow, true, "http://127.0.0.1:18080/v1/run-7", 1},
		{"contained open", egress.Open, true, "http://10.1.2.3:8088/v1/run-7", 0},
		{"not contained", egress.None, false, "http://10.1.2.3:8088/v1/run-7", 1},
	} {
		n := &sandbox.Network{Policy: egress.Policy{Mode: tc.mode}}
		got, err := agentBaseURL("http://10.1.2.3:8088/v1/run-7", n, tc.contained)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
		require.Len(t, n.Forwards, tc.forwards, tc.name)
		if tc.forwards == 1 {
			require.Equal(t, sandbox.Forward{Port: ModelForwardPort, To: "10.1.2.3:8088"}, n.Forwards[0], tc.name)
		}
	}
	n := &sandbox.Network{}
	got, err := agentBaseURL("http://gateway.internal", n, true)
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:18080", got)
	require.Equal(t, "gateway.internal:80", n.Forwards[0].To)
	for _, bad := range []string{"https://api.anthropic.com", "gateway:8080", "http://", "::"} {
		_, err := agentBaseURL(bad, &sandbox.Network{}, true)
		require.Error(t, err, bad)
	}
}

// A job's network: the worker's default when absent, refused above the
// maximum (network_not_allowed) or when invalid (invalid_job); a
// Cloudflare job may only ask for "open".
func TestJobNetwork(t *testing.T) {
	w := &Worker{cfg: Config{DefaultSandbox: protocol.SandboxLocal,
		Network: NetworkConfig{Default: egress.Policy{Mode: egress.None}, Max: egress.Allow}}}
	job := func(sb, net string) *protocol.Job {
		j := &protocol.Job{ID: "q", Sandbox: sb}
		if net != "" {
			j.Network = json.RawMessage(net)
		}
		return j
	}
	p, err := w.jobNetwork(job("", ""))
	require.NoError(t, err)
	require.Equal(t, egress.None, p.Mode)
	p, err = w.jobNetwork(job("", `{"allow":["github.com"]}`))
	require.NoError(t, err)
	require.Equal(t, egress.Allow, p.Mode)

	_, err = w.jobNetwork(job("", `"open"`))
	var na *egress.NotAllowedError
	require.ErrorAs(t, err, &na)
	require.Equal(t, egress.Code, rejectCode(err))

	// A job naming the worker's loopback or the cloud metadata address,
	// however written, fails with the entry named: network_not_allowed.
	for _, e := range []string{"127.0.0.1:9090", "localhost:4222", "0x7f.1:8222", "169.254.169.254", "[::ffff:10.0.0.1]"} {
		_, err = w.jobNetwork(job("", `{"allow":["github.com","`+e+`"]}`))
		var de *egress.DeniedError
		require.ErrorAs(t, err, &de, e)
		require.ErrorContains(t, err, "network.allow[1]", e)
		require.Equal(t, egress.Code, rejectCode(err), e)
	}
	w.cfg.Network.Deny, err = egress.ParseAllow("127.0.0.0/8")
	require.NoError(t, err)
	_, err = w.jobNetwork(job("", `{"allow":["localhost:4222"]}`))
	require.NoError(t, err, "the operator allowed loopback")

	_, err = w.jobNetwork(job("", `{"allow":"github.com"}`))
	require.ErrorIs(t, err, egress.ErrInvalid)
	require.Equal(t, protocol.CodeInvalidJob, rejectCode(err))

	_, err = w.jobNetwork(job(protocol.SandboxCloudflare, `"none"`))
	require.ErrorContains(t, err, "cloudflare sandbox cannot enforce it")
	require.Equal(t, egress.Code, rejectCode(err))
	_, err = w.jobNetwork(job(protocol.SandboxCloudflare, ""))
	require.NoError(t, err, "a Cloudflare job without network runs as before")
	w.cfg.Network.Max = egress.Open
	p, err = w.jobNetwork(job(protocol.SandboxCloudflare, `"open"`))
	require.NoError(t, err)
	require.Equal(t, egress.Open, p.Mode)
}

// fakeContained is a provider that reports its isolation.
type fakeContained struct {
	sandbox.Provider
	contained bool
}

func (f fakeContained) Contained() bool { return f.contained }

// The model URL the gateway's wiring gives the agent: the forward's
// address in a contained local sandbox (network none or allow), the
// gateway's own with an open network or without containment.
func TestAgentModelURL(t *testing.T) {
	gw := "http://127.0.0.1:41234"
	for _, tc := range []struct {
		contained bool
		network   string
		want      string
	}{
		{true, "", "http://127.0.0.1:18080"},
		{true, `{"allow":["github.com"]}`, "http://127.0.0.1:18080"},
		{true, `"open"`, gw},
		{false, "", gw},
	} {
		w := &Worker{cfg: Config{DefaultSandbox: protocol.SandboxLocal,
			Providers: map[string]sandbox.Provider{protocol.SandboxLocal: fakeContained{contained: tc.contained}},
			Network:   NetworkConfig{Max: egress.Open, ModelURL: gw}}}
		job := &protocol.Job{ID: "q"}
		if tc.network != "" {
			job.Network = json.RawMessage(tc.network)
		}
		q := &query{w: w, job: job}
		require.Equal(t, tc.want, q.agentModelURL(gw), "%v %s", tc.contained, tc.network)
	}
}
