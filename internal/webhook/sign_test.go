package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// verify checks a Standard Webhooks signature from the specification
// (spec/standard-webhooks.md), independently of the library the service
// signs with: HMAC-SHA256 over "id.timestamp.body" with the base64 key
// after whsec_, compared with each "v1,<base64>" of the header.
func verify(secret string, h http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	if id == "" || ts == "" || h.Get("webhook-signature") == "" {
		return errors.New("missing webhook headers")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		v, b64, ok := strings.Cut(sig, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no matching signature")
}

// TestVerifierMatchesTheSpecVector: the verifier the tests check every
// delivery with accepts the specification's published vector and nothing
// else.
func TestVerifierMatchesTheSpecVector(t *testing.T) {
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	require.NoError(t, verify(secret, h, []byte(`{"test": 2432232314}`)))
	require.Error(t, verify(secret, h, []byte(`{"test": 2432232315}`)))
	h.Set("webhook-id", "msg_other")
	require.Error(t, verify(secret, h, []byte(`{"test": 2432232314}`)))
}
