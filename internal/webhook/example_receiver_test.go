package webhook_test

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"os"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Example_receiver is the receiver of docs/webhooks.md: it verifies each
// delivery's signature (and its timestamp, within 5 minutes) before
// trusting it, and answers 2xx quickly.
func Example_receiver() {
	wh, err := standardwebhooks.NewWebhook(os.Getenv("FLEET_WEBHOOK_SECRET")) // whsec_… from `webhook add`
	if err != nil {
		log.Fatal(err)
	}
	seen := map[string]bool{} // webhook-id → handled (deliveries are at least once)
	http.HandleFunc("POST /fleet-hook", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		if err := wh.Verify(body, r.Header); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type string `json:"type"`
			Data struct {
				ID, Tenant, State string
				Result            *struct {
					Result       string  `json:"result"`
					TotalCostUSD float64 `json:"total_cost_usd"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, "json", http.StatusBadRequest)
			return
		}
		id := r.Header.Get("webhook-id")
		if !seen[id] {
			seen[id] = true
			log.Printf("%s: query %s/%s", ev.Type, ev.Data.Tenant, ev.Data.ID)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	// log.Fatal(http.ListenAndServe(":8443", nil)) // behind TLS in production
}
