package fleetcli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/webhook"
)

// webhookCmd is `dispatcher tenant webhook add|ls|rm|deliveries`: a
// tenant's webhook endpoints (docs/webhooks.md), through the webhook API that
// `dispatcher serve` answers on <prefix>.api.webhook.*.
type webhookCmd struct {
	active           bool
	op, tenant, url  string
	endpoint, events string
}

// webhookHelp is added to tenant's help.
const webhookHelp = `
tenant webhook add TENANT URL [--events E,…] registers an endpoint that
receives the tenant's status events as signed Standard Webhooks (events:
succeeded, failed, cancelled, idle, awaiting_approval; default all) and
prints its id and signing secret (whsec_…, shown once). webhook ls TENANT,
webhook rm TENANT ID, webhook deliveries TENANT [--endpoint ID] (each
attempt: webhook id, event, HTTP status or error, time, next retry).
URLs on loopback, private or link-local addresses are refused unless
dispatcher serve runs with --webhook-allow-private.`

func (c *webhookCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.events, "events", "", "webhook add: the events to deliver, comma-separated (default: all)")
	fs.StringVar(&c.endpoint, "endpoint", "", "webhook deliveries: one endpoint's only")
}

func (c *webhookCmd) validate(fs *pflag.FlagSet) error {
	c.active = true
	c.op = fs.Arg(1)
	want := map[string]int{webhook.OpAdd: 4, webhook.OpList: 3, webhook.OpRemove: 4, webhook.OpDeliveries: 3}[c.op]
	if want == 0 {
		return fmt.Errorf("tenant webhook: want add, ls, rm or deliveries, got %q", c.op)
	}
	if fs.NArg() != want {
		return fmt.Errorf("tenant webhook %s takes %d argument(s), got %q", c.op, want-2, fs.Args()[2:])
	}
	if fs.Changed("events") && c.op != webhook.OpAdd {
		return fmt.Errorf("--events goes with tenant webhook add only")
	}
	if fs.Changed("endpoint") && c.op != webhook.OpDeliveries {
		return fmt.Errorf("--endpoint goes with tenant webhook deliveries only")
	}
	c.tenant = fs.Arg(2)
	switch c.op {
	case webhook.OpAdd:
		c.url = fs.Arg(3)
		if _, err := webhook.ParseEvents(c.events); err != nil {
			return err
		}
	case webhook.OpRemove:
		c.endpoint = fs.Arg(3)
	}
	return validTenant(c.tenant)
}

func (c *webhookCmd) run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	req := webhook.Request{Tenant: c.tenant, URL: c.url, Endpoint: c.endpoint}
	if c.op == webhook.OpAdd {
		req.Events, _ = webhook.ParseEvents(c.events)
	}
	rep, err := webhook.Call(rctx, cl.NC, cl.Names, c.op, req)
	if err != nil {
		fmt.Fprintln(e.Err, err)
		return ExitUnavailable
	}
	if rep.Error != nil {
		fmt.Fprintf(e.Err, "tenant webhook %s: %s\n", c.op, rep.Error.Message)
		switch rep.Error.Code {
		case webhook.CodeInvalid:
			return ExitUsage
		case webhook.CodeNotFound:
			return ExitNotFound
		}
		return ExitUnavailable
	}
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	defer func() { _ = tw.Flush() }()
	switch c.op {
	case webhook.OpAdd:
		fmt.Fprintf(tw, "endpoint\t%s\nsecret\t%s\n", rep.Endpoint.ID, rep.Endpoint.Secret)
		fmt.Fprintln(e.Err, "keep the secret: it verifies the webhook-signature of every delivery, and is not shown again")
	case webhook.OpList:
		fmt.Fprintln(tw, "ID\tURL\tEVENTS\tCREATED")
		for _, ep := range rep.Endpoints {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ep.ID, ep.URL, strings.Join(ep.Events, ","), ep.Created.Local().Format(time.DateTime))
		}
	case webhook.OpDeliveries:
		printDeliveries(tw, rep.Deliveries)
	}
	return ExitOK
}

// printDeliveries prints one row per attempt (a delivery with none yet:
// one row saying so).
func printDeliveries(tw *tabwriter.Writer, ds []webhook.Delivery) {
	fmt.Fprintln(tw, "WEBHOOK_ID\tENDPOINT\tEVENT\tQUERY\tTIME\tRESULT\tNEXT_RETRY")
	for _, d := range ds {
		next := "-"
		switch {
		case d.GaveUp:
			next = "gave up"
		case !d.NextRetry.IsZero() && !d.Done:
			next = d.NextRetry.Local().Format(time.DateTime)
		}
		if len(d.Attempts) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.WebhookID, d.Endpoint, d.Type, d.QueryID, d.Created.Local().Format(time.DateTime), "pending", next)
		}
		for i, a := range d.Attempts {
			res := a.Error
			if res == "" {
				res = fmt.Sprintf("HTTP %d", a.Status)
			} else if a.Status != 0 && !strings.Contains(res, fmt.Sprint(a.Status)) {
				res = fmt.Sprintf("HTTP %d: %s", a.Status, res)
			}
			n := "-"
			if i == len(d.Attempts)-1 {
				n = next
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.WebhookID, d.Endpoint, d.Type, d.QueryID, a.At.Local().Format(time.DateTime), res, n)
		}
	}
}
