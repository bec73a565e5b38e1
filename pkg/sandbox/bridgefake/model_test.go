package bridgefake_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

// TestModelRoutes: the /model routes keep a run per sandbox, with or
// without an egress, validate what they are given, and need the token.
func TestModelRoutes(t *testing.T) {
	f := bridgefake.New(t, bridgefake.Options{})
	st, b := do(t, f, http.MethodGet, "/v1/sb/s1/model", "", nil)
	require.Equal(t, http.StatusNotFound, st)
	require.Contains(t, string(b), "model_run_not_found")

	open := map[string]any{"tenant": "acme", "query_id": "q1", "attempt": 1, "first_call": 5, "max_cost_usd": 2, "spent_usd": 0.5}
	st, _ = do(t, f, http.MethodPut, "/v1/sb/s1/model", "wrong", open)
	require.Equal(t, http.StatusUnauthorized, st)
	for _, bad := range []map[string]any{
		{"tenant": "", "query_id": "q", "attempt": 1, "first_call": 1},
		{"tenant": "t", "query_id": "q", "attempt": -1, "first_call": 1},
		{"tenant": "t", "query_id": "q", "attempt": 1, "first_call": 0},
		{"tenant": "t", "query_id": "q", "attempt": 1},
		{"tenant": "t", "query_id": "q", "attempt": 1, "first_call": 1, "max_cost_usd": 0},
		{"tenant": "t", "query_id": "q", "attempt": 1, "first_call": 1, "spent_usd": -1},
	} {
		st, b = do(t, f, http.MethodPut, "/v1/sb/s1/model", "", bad)
		require.Equal(t, http.StatusBadRequest, st, "%v", bad)
		require.Contains(t, string(b), "invalid_model_run")
	}
	st, b = do(t, f, http.MethodPut, "/v1/sb/s1/model", "", open)
	require.Equal(t, http.StatusOK, st, string(b))
	st, b = do(t, f, http.MethodGet, "/v1/sb/s1/model?from=0", "", nil)
	require.Equal(t, http.StatusOK, st)
	var rep struct {
		Events   []json.RawMessage `json:"events"`
		Next     int               `json:"next"`
		SpentUSD float64           `json:"spent_usd"`
		Capped   bool              `json:"capped"`
	}
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Empty(t, rep.Events)
	require.Equal(t, 0, rep.Next)
	require.InDelta(t, 0.5, rep.SpentUSD, 1e-12)
	require.False(t, rep.Capped)
	st, _ = do(t, f, http.MethodGet, "/v1/sb/s1/model?from=x", "", nil)
	require.Equal(t, http.StatusBadRequest, st)
	st, _ = do(t, f, http.MethodDelete, "/v1/sb/s1/model", "", nil)
	require.Equal(t, http.StatusOK, st)
	st, _ = do(t, f, http.MethodDelete, "/v1/sb/s1/model", "", nil)
	require.Equal(t, http.StatusNotFound, st, "closed")
}

// TestModelEgressEnv: processes get the egress's URL and the placeholder
// only when the fake meters model calls, never the key.
func TestModelEgressEnv(t *testing.T) {
	for _, metered := range []bool{false, true} {
		opts := bridgefake.Options{}
		if metered {
			opts.ModelUpstream, opts.ModelAPIKey = "http://127.0.0.1:9", "sk-fake-worker-key"
		}
		f := bridgefake.New(t, opts)
		st, _ := do(t, f, http.MethodPut, "/v1/sb/e1", "", nil)
		require.Equal(t, http.StatusOK, st)
		st, b := do(t, f, http.MethodPost, "/v1/sb/e1/proc", "", map[string]any{"proc_id": "p", "argv": []string{"true"}})
		require.Equal(t, http.StatusOK, st, string(b))
		env := strings.Join(f.ProcEnv("e1", "p"), "\n")
		require.NotContains(t, env, "sk-fake-worker-key")
		if metered {
			require.Contains(t, env, "ANTHROPIC_API_KEY="+bridgefake.CredentialPlaceholder)
			require.Contains(t, env, "ANTHROPIC_BASE_URL=http://127.0.0.1:")
			require.Contains(t, env, "/sb/e1")
		} else {
			require.NotContains(t, env, "ANTHROPIC_")
		}
		st, _ = do(t, f, http.MethodDelete, "/v1/sb/e1", "", nil)
		require.Equal(t, http.StatusNoContent, st)
	}
}
