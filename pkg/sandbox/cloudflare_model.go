package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ModelMetered is an optional ability of a Sandbox whose model calls leave
// through a metered egress the provider runs (the Cloudflare bridge,
// docs/gateway.md): the worker opens a model run on it, reads its calls while the run
// goes on, and closes it at the end. The credential is the egress's own;
// nothing here carries it. Check for it with a type assertion.
type ModelMetered interface {
	// OpenModelRun opens the sandbox's model run (replacing any open one):
	// from now on its calls are forwarded with the egress's credential,
	// metered, and refused with 402 once the cap is reached. Before, and
	// after CloseModelRun, they get 401.
	OpenModelRun(ctx context.Context, run ModelRun) error
	// ModelCalls reports the open run's calls from cursor from on (0 is
	// the first), with its spend and whether its cap is reached. No open
	// run is an error wrapping ErrNotFound.
	ModelCalls(ctx context.Context, from int) (ModelReport, error)
	// CloseModelRun reports like ModelCalls, then closes the run. No open
	// run is an error wrapping ErrNotFound.
	CloseModelRun(ctx context.Context, from int) (ModelReport, error)
}

// ModelRun is what a model run is opened with.
type ModelRun struct {
	Tenant  string `json:"tenant"`
	QueryID string `json:"query_id"`
	Attempt int    `json:"attempt"`
	// FirstCall is the number of the run's first call (calls count from 1
	// per query, across attempts and turns).
	FirstCall int `json:"first_call"`
	// MaxCostUSD caps the run's spend, SpentUSD included; 0 is no cap.
	MaxCostUSD float64 `json:"max_cost_usd,omitempty"`
	// SpentUSD is what the query spent before this run.
	SpentUSD float64 `json:"spent_usd"`
}

// ModelCall is one metered call, with the JSON of a .model event (docs/gateway.md).
type ModelCall = protocol.ModelEvent

// ModelReport is a model run's state as the egress reports it.
type ModelReport struct {
	// Calls are the run's calls from the cursor asked for on.
	Calls []ModelCall `json:"events"`
	// Next is the cursor to ask from next.
	Next int `json:"next"`
	// SpentUSD is the run's spend, the opening SpentUSD included.
	SpentUSD float64 `json:"spent_usd"`
	// MaxCostUSD is the run's cap (0: none).
	MaxCostUSD float64 `json:"max_cost_usd,omitempty"`
	// Capped reports that the spend reached the cap: the run's next call
	// is refused with 402.
	Capped bool `json:"capped"`
}

var _ ModelMetered = (*cfSandbox)(nil)

func (s *cfSandbox) modelPath() string { return "/v1/sb/" + s.id + "/model" }

// OpenModelRun implements ModelMetered: PUT /v1/sb/:id/model.
func (s *cfSandbox) OpenModelRun(ctx context.Context, run ModelRun) error {
	switch {
	case run.Tenant == "" || run.QueryID == "":
		return Invalidf("cloudflare: model run: tenant and query id are required")
	case run.Attempt < 0 || run.FirstCall < 1:
		return Invalidf("cloudflare: model run: attempt must be >= 0 and first call >= 1")
	case !finiteNonNeg(run.MaxCostUSD) || !finiteNonNeg(run.SpentUSD):
		return Invalidf("cloudflare: model run: max cost and spend must be finite and >= 0")
	}
	body, err := json.Marshal(run)
	if err != nil {
		return Invalidf("cloudflare: model run: %v", err)
	}
	err = s.c.retry(ctx, func(ctx context.Context) error {
		return s.c.call(ctx, http.MethodPut, s.modelPath(), nil, "application/json", body, nil)
	})
	if err != nil {
		return fmt.Errorf("cloudflare: open model run in %s: %w", s.id, cfSandboxGone(err))
	}
	return nil
}

// ModelCalls implements ModelMetered: GET /v1/sb/:id/model?from=N.
func (s *cfSandbox) ModelCalls(ctx context.Context, from int) (ModelReport, error) {
	return s.modelReport(ctx, http.MethodGet, from)
}

// CloseModelRun implements ModelMetered: DELETE /v1/sb/:id/model?from=N.
// A retried close whose first answer was lost finds no run (ErrNotFound).
func (s *cfSandbox) CloseModelRun(ctx context.Context, from int) (ModelReport, error) {
	return s.modelReport(ctx, http.MethodDelete, from)
}

func (s *cfSandbox) modelReport(ctx context.Context, method string, from int) (ModelReport, error) {
	if from < 0 {
		return ModelReport{}, Invalidf("cloudflare: model calls: negative cursor %d", from)
	}
	q := url.Values{"from": {strconv.Itoa(from)}}
	var rep ModelReport
	err := s.c.retry(ctx, func(ctx context.Context) error {
		_, b, err := s.c.send(ctx, method, s.modelPath(), q, "", nil, cfMaxJSONBytes)
		if err != nil {
			return err
		}
		rep, err = decodeModelReport(b, from)
		return err
	})
	if err != nil {
		var he *cfHTTPError
		if errors.As(err, &he) && he.Status == http.StatusNotFound && he.Code == "model_run_not_found" {
			return ModelReport{}, fmt.Errorf("cloudflare: model run of %s: %w", s.id, err)
		}
		return ModelReport{}, fmt.Errorf("cloudflare: model run of %s: %w", s.id, cfSandboxGone(err))
	}
	return rep, nil
}

// decodeModelReport reads the bridge's answer: the cursor must move on by
// the calls it carries, and no count or cost may be negative or NaN. A bad
// answer wraps ErrUnavailable (asked again).
func decodeModelReport(b []byte, from int) (ModelReport, error) {
	var rep ModelReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return ModelReport{}, fmt.Errorf("%w: model report: %w", ErrUnavailable, err)
	}
	bad := func(what string) (ModelReport, error) {
		return ModelReport{}, fmt.Errorf("%w: model report: %s", ErrUnavailable, what)
	}
	if rep.Next != from+len(rep.Calls) && !(len(rep.Calls) == 0 && rep.Next >= from) {
		return bad(fmt.Sprintf("cursor %d after %d calls from %d", rep.Next, len(rep.Calls), from))
	}
	if !finiteNonNeg(rep.SpentUSD) || !finiteNonNeg(rep.MaxCostUSD) {
		return bad("spend or cap is not a finite number >= 0")
	}
	for _, c := range rep.Calls {
		if c.Call < 1 || c.Attempt < 0 || c.InputTokens < 0 || c.OutputTokens < 0 || c.CacheReadInputTokens < 0 ||
			c.CacheCreationInputTokens < 0 || !finiteNonNeg(c.CostUSD) || c.MS < 0 {
			return bad(fmt.Sprintf("call %d has a negative or non-finite field", c.Call))
		}
	}
	return rep, nil
}

func finiteNonNeg(f float64) bool { return f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }
