package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// shareVariant is one way of publishing a relayed line in serverShare.
type shareVariant int

const (
	sharePlain     shareVariant = iota // the line's own headers only (the relay baseline)
	sharePad                           // plus the fence's header bytes under names the server ignores
	shareFence                         // plus the fence's two headers
	shareConsumers                     // the fence, into a stream with the dispatcher's three consumers
	shareVariants
)

var shareNames = [shareVariants]string{"plain", "pad", "fence", "fence_consumers"}

// serverShare measures what the fleet's guarantees cost the server per
// stored line, apart from everything else of the fleet: one embedded
// nats-server and one nats.go client publish 1 KiB lines asynchronously
// (256 in flight) into a stream configured like FLEET_QUERIES, in slices
// of per lines, each variant once per round in a rotating order, rounds
// times; it returns each variant's wall time per line. Client and server
// share the machine's cores, so the differences are the server's extra
// work on the path every line takes.
func serverShare(t testing.TB, rounds, per int) (us [shareVariants]float64) {
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	ctx := context.Background()
	const stream = "SHARE"
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{"fleet.query.>"}, Storage: jetstream.FileStorage,
		MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute, AllowDirect: true,
	})
	require.NoError(t, err)
	pub, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	require.NoError(t, err)
	var took [shareVariants]time.Duration
	for round := range rounds {
		for i := range shareVariants {
			v := (i + shareVariant(round)) % shareVariants
			q := "q" + strconv.Itoa(round) + "-" + strconv.Itoa(int(v))
			status := "fleet.query.default." + q + ".status"
			ack, err := js.Publish(ctx, status, []byte(`{"state":"running"}`))
			require.NoError(t, err)
			token := strconv.FormatUint(ack.Sequence, 10)
			if v == shareConsumers {
				for c, f := range []string{"fleet.query.*.*.status", "fleet.query.*.*.status", "fleet.query.*.*.ctl"} {
					_, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
						Durable: "c" + strconv.Itoa(c), FilterSubject: f, AckPolicy: jetstream.AckExplicitPolicy,
					})
					require.NoError(t, err)
				}
			}
			start := time.Now()
			for seq := 1; seq <= per; seq++ {
				m := nats.NewMsg("fleet.query.default." + q + ".msg")
				m.Data = relayPayload
				s := strconv.Itoa(seq)
				m.Header.Set(protocol.HeaderSeq, s)
				m.Header.Set(protocol.HeaderAttempt, "1")
				m.Header.Set(protocol.HeaderMsgID, protocol.LineMsgID("default", q, 1, uint64(seq)))
				m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
				switch v {
				case sharePad:
					m.Header.Set("Xxxx-Expected-Last-Subject-Sequence-Subject", status)
					m.Header.Set("Xxxx-Expected-Last-Subject-Sequence", token)
				case shareFence, shareConsumers:
					m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, status)
					m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, token)
				}
				publishAsync(pub, m)
			}
			waitPublished(t, pub)
			took[v] += time.Since(start)
			if v == shareConsumers {
				for c := range 3 {
					require.NoError(t, js.DeleteConsumer(ctx, stream, "c"+strconv.Itoa(c)))
				}
			}
			// Every line stored: none refused by the fence.
			st, err := js.Stream(ctx, stream)
			require.NoError(t, err)
			m, err := st.GetLastMsgForSubject(ctx, "fleet.query.default."+q+".msg")
			require.NoError(t, err)
			require.Equal(t, strconv.Itoa(per), m.Header.Get(protocol.HeaderSeq))
		}
	}
	for v := range shareVariants {
		us[v] = float64(took[v].Nanoseconds()) / 1e3 / float64(rounds*per)
	}
	return us
}

// BenchmarkServerShare prints serverShare's figures: wall µs per line of
// each variant, and each step's ratio to the one before (the fence's
// bytes, its check, the consumers).
func BenchmarkServerShare(b *testing.B) {
	us := serverShare(b, 15, 8000)
	for v := range shareVariants {
		figure("server_share_"+shareNames[v]+"_us_per_line", us[v], "us")
	}
	figure("server_share_fence_ratio", us[sharePlain]/us[shareFence], "ratio")
	figure("server_share_fence_bytes_ratio", us[sharePlain]/us[sharePad], "ratio")
	figure("server_share_consumers_ratio", us[shareFence]/us[shareConsumers], "ratio")
	figure("server_share_ratio", us[sharePlain]/us[shareConsumers], "ratio")
	b.ReportMetric(us[sharePlain]/us[shareConsumers], "server_share_ratio")
}
