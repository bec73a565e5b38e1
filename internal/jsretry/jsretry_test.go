package jsretry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRetryStopsAtAPermanentError: an error that another try cannot fix
// (here: a stream name in use with another configuration) is returned at
// once; a transient one is tried again until the context ends, and the
// error says both.
func TestRetryStopsAtAPermanentError(t *testing.T) {
	var tries int
	inUse := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}
	err := Do(context.Background(), func(context.Context) error { tries++; return inUse })
	require.ErrorIs(t, err, inUse)
	require.Equal(t, 1, tries)

	tries = 0
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	notAvail := &jetstream.APIError{Code: 503, ErrorCode: errCodeClusterNotAvail, Description: "JetStream system temporarily unavailable"}
	err = Do(ctx, func(context.Context) error { tries++; return notAvail })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, notAvail)
	require.Greater(t, tries, 1)
	require.True(t, errors.Is(err, notAvail))
}
