// Package keda holds the KEDA ScaledObject of the workers; its test checks
// the manifest against the fleet's names and the worker's default slots.
package keda

import (
	"bytes"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

type scaledObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		ScaleTargetRef  struct{ Name string } `yaml:"scaleTargetRef"`
		MinReplicaCount *int                  `yaml:"minReplicaCount"`
		MaxReplicaCount int                   `yaml:"maxReplicaCount"`
		Triggers        []struct {
			Type     string            `yaml:"type"`
			Metadata map[string]string `yaml:"metadata"`
		} `yaml:"triggers"`
	} `yaml:"spec"`
}

// workerDefaultSlots is cmd/worker's --slots default.
const workerDefaultSlots = 4

func TestScaledObject(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("scaledobject.yaml")
	require.NoError(t, err)
	var so scaledObject
	dec := yaml.NewDecoder(bytes.NewReader(b))
	require.NoError(t, dec.Decode(&so))
	require.Equal(t, "keda.sh/v1alpha1", so.APIVersion)
	require.Equal(t, "ScaledObject", so.Kind)
	require.NotEmpty(t, so.Spec.ScaleTargetRef.Name)
	require.NotNil(t, so.Spec.MinReplicaCount)
	require.Equal(t, 0, *so.Spec.MinReplicaCount, "scale to zero")
	require.Positive(t, so.Spec.MaxReplicaCount)
	require.Len(t, so.Spec.Triggers, 1, "one trigger, on the one work consumer")
	tr := so.Spec.Triggers[0]
	require.Equal(t, "nats-jetstream", tr.Type)
	n := protocol.NewNames("")
	require.Equal(t, n.JobsStream(), tr.Metadata["stream"])
	require.Equal(t, n.Consumer(), tr.Metadata["consumer"])
	require.Equal(t, "FLEET", tr.Metadata["account"])
	require.NotEmpty(t, tr.Metadata["natsServerMonitoringEndpoint"])
	lag, err := strconv.Atoi(tr.Metadata["lagThreshold"])
	require.NoError(t, err)
	require.Equal(t, workerDefaultSlots, lag, "lagThreshold = slots per pod")
}
