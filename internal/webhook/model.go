package webhook

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nuid"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Events an endpoint may ask for.
var Events = []string{
	string(protocol.StateSucceeded), string(protocol.StateFailed), string(protocol.StateCancelled),
	string(protocol.StateIdle), string(protocol.StateAwaitingApproval),
}

// Endpoint is one receiver of a tenant.
type Endpoint struct {
	ID      string    `json:"id"`
	Tenant  string    `json:"tenant"`
	URL     string    `json:"url"`
	Events  []string  `json:"events"`
	Secret  string    `json:"secret,omitempty"`
	Created time.Time `json:"created"`
}

// Wants reports whether the endpoint takes events of state s.
func (e Endpoint) Wants(s protocol.State) bool { return slices.Contains(e.Events, string(s)) }

// Attempt is one try of a delivery.
type Attempt struct {
	At time.Time `json:"at"`
	// Status is the receiver's HTTP status; 0 when there was none.
	Status int `json:"status,omitempty"`
	// Error says why the attempt failed ("" when it succeeded).
	Error string `json:"error,omitempty"`
}

// Delivery is one status event for one endpoint, with its attempts.
type Delivery struct {
	WebhookID string    `json:"webhook_id"`
	Tenant    string    `json:"tenant"`
	Endpoint  string    `json:"endpoint"`
	QueryID   string    `json:"query_id"`
	Type      string    `json:"type"`
	Created   time.Time `json:"created"`
	// Body is the payload, signed anew on each attempt.
	Body     json.RawMessage `json:"body"`
	Attempts []Attempt       `json:"attempts,omitempty"`
	// NextRetry is when the next attempt is due; zero once done.
	NextRetry time.Time `json:"next_retry,omitzero"`
	// Done: delivered (2xx). GaveUp: 24 hours of failures.
	Done   bool `json:"done,omitempty"`
	GaveUp bool `json:"gave_up,omitempty"`
}

// Payload is a delivery's body.
type Payload struct {
	Type      string               `json:"type"`
	Timestamp time.Time            `json:"timestamp"`
	Data      protocol.StatusEvent `json:"data"`
}

func endpointKey(tenant, id string) string { return tenant + "." + id }

func deliveryKey(tenant, endpoint, webhookID string) string {
	return tenant + "." + endpoint + "." + webhookID
}

// webhookID is the id of the delivery of the status event at stream
// sequence seq to endpoint: the same on every retry and redelivery.
func webhookID(endpoint string, seq uint64) string {
	return fmt.Sprintf("msg_%s_%d", endpoint, seq)
}

func newEndpointID() string { return "ep_" + nuid.Next() }

// newSecret is a Standard Webhooks secret: whsec_ and 32 random bytes.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b), nil
}

// ParseEvents reads --events: a comma-separated subset of Events ("" = all).
func ParseEvents(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return slices.Clone(Events), nil
	}
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if !slices.Contains(Events, e) {
			return nil, fmt.Errorf("--events: %q is not one of %s", e, strings.Join(Events, ","))
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, nil
}
