// Package charttest checks the agentfleet Helm chart (deploy/helm/agentfleet)
// without a cluster: helm lint, helm template for the default values and
// each examples/*.yaml, every rendered object decoded strictly into its
// k8s.io/api type (an unknown or misplaced field fails), the workers'
// securityContext, and the values that must fail (an unknown key, no
// existingSecret). Helm is v4, a tool dependency of this module (built
// once by TestMain and executed), kept
// out of the main module's go.mod. The official NATS chart cannot be
// fetched here: a stub named nats stands in for it in a copy of the chart,
// so the dependency is satisfied and renders nothing.
package charttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../agentfleet"

// chartCopy is the chart in a temporary directory with a stub nats chart
// in charts/.
func chartCopy(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "agentfleet")
	if out, err := exec.Command("cp", "-r", chartDir, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	stub := filepath.Join(dir, "charts", "nats")
	if err := os.MkdirAll(stub, 0o755); err != nil {
		t.Fatal(err)
	}
	meta := "apiVersion: v2\nname: nats\nversion: 1.3.0\ndescription: stand-in for the official NATS chart (not reachable from CI)\n"
	if err := os.WriteFile(filepath.Join(stub, "Chart.yaml"), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// helmBin is helm v4, built once by TestMain from this module's tool
// dependency (the version go.mod pins).
var helmBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "charttest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	helmBin = filepath.Join(dir, "helm")
	if out, err := exec.Command("go", "build", "-o", helmBin, "helm.sh/helm/v4/cmd/helm").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build helm: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func helm(args ...string) (string, error) {
	cmd := exec.Command(helmBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func TestChartLintsAndRendersStrictly(t *testing.T) {
	dir := chartCopy(t)
	if out, err := helm("lint", "--strict", dir, "--set", "existingSecret=creds"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	sets := map[string][]string{"defaults": {"--set", "existingSecret=creds"}}
	examples, err := filepath.Glob(filepath.Join(chartDir, "examples", "*.yaml"))
	if err != nil || len(examples) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, e := range examples {
		abs, _ := filepath.Abs(e)
		sets[filepath.Base(e)] = []string{"-f", abs}
	}
	for name, args := range sets {
		t.Run(name, func(t *testing.T) {
			out, err := helm(append([]string{"template", "fleet", dir, "--namespace", "fleet"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			kinds := decodeAll(t, out)
			for _, k := range []string{"Deployment/fleet-worker", "Deployment/fleet-dispatcher", "PodDisruptionBudget/fleet-worker", "NetworkPolicy/fleet-worker"} {
				if kinds[k] == nil {
					t.Errorf("%s not rendered (have %v)", k, keys(kinds))
				}
			}
			if w, ok := kinds["Deployment/fleet-worker"].(*appsv1.Deployment); ok {
				checkWorker(t, w)
			}
		})
	}
}

func keys(m map[string]any) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// decodeAll decodes every object of a rendered chart strictly into its type
// and returns them by Kind/name.
func decodeAll(t *testing.T, rendered string) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, doc := range strings.Split(rendered, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("YAML: %v\n%s", err, doc)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(js, &head); err != nil || head.Kind == "" {
			t.Fatalf("no kind: %v\n%s", err, doc)
		}
		obj := decodeOne(t, head.APIVersion, head.Kind, js)
		objs[head.Kind+"/"+head.Metadata.Name] = obj
	}
	return objs
}

func decodeOne(t *testing.T, apiVersion, kind string, js []byte) any {
	t.Helper()
	var obj any
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "keda.sh/v1alpha1 ScaledObject":
		checkScaledObject(t, js)
		return js
	case "monitoring.coreos.com/v1 ServiceMonitor":
		checkServiceMonitor(t, js)
		return js
	default:
		t.Fatalf("unexpected object %s %s", apiVersion, kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		t.Fatalf("%s: %v\n%s", kind, err, js)
	}
	return obj
}

// checkWorker: the securityContext a contained worker needs and no more.
func checkWorker(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	p := d.Spec.Template.Spec
	if p.HostUsers == nil || *p.HostUsers {
		t.Errorf("worker: hostUsers is not false")
	}
	sc := p.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil {
		t.Fatalf("worker pod securityContext: %+v", sc)
	}
	if p.TerminationGracePeriodSeconds == nil || *p.TerminationGracePeriodSeconds < 16 {
		t.Errorf("worker: terminationGracePeriodSeconds %v", p.TerminationGracePeriodSeconds)
	}
	c := p.Containers[0].SecurityContext
	if c == nil || c.ProcMount == nil || *c.ProcMount != corev1.UnmaskedProcMount {
		t.Fatalf("worker: procMount is not Unmasked: %+v", c)
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation || (c.Privileged != nil && *c.Privileged) {
		t.Errorf("worker: privilege escalation or privileged")
	}
	if c.Capabilities == nil || len(c.Capabilities.Add) != 0 || len(c.Capabilities.Drop) != 1 || c.Capabilities.Drop[0] != "ALL" {
		t.Errorf("worker: capabilities %+v, want drop ALL and nothing added", c.Capabilities)
	}
}

// checkScaledObject: the minimal shape KEDA needs for the nats-jetstream
// trigger on the workers' consumer.
func checkScaledObject(t *testing.T, js []byte) {
	t.Helper()
	var so struct {
		Spec struct {
			ScaleTargetRef struct {
				Name string `json:"name"`
			} `json:"scaleTargetRef"`
			MinReplicaCount *int `json:"minReplicaCount"`
			MaxReplicaCount *int `json:"maxReplicaCount"`
			PollingInterval int  `json:"pollingInterval"`
			CooldownPeriod  int  `json:"cooldownPeriod"`
			Triggers        []struct {
				Type     string            `json:"type"`
				Metadata map[string]string `json:"metadata"`
			} `json:"triggers"`
		} `json:"spec"`
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&so); err != nil {
		t.Fatalf("ScaledObject: %v\n%s", err, js)
	}
	s := so.Spec
	if s.ScaleTargetRef.Name != "fleet-worker" || s.MinReplicaCount == nil || s.MaxReplicaCount == nil || len(s.Triggers) != 1 {
		t.Fatalf("ScaledObject: %s", js)
	}
	tr := s.Triggers[0]
	if tr.Type != "nats-jetstream" || tr.Metadata["stream"] != "FLEET_JOBS" || tr.Metadata["consumer"] != "workers" ||
		tr.Metadata["account"] == "" || tr.Metadata["natsServerMonitoringEndpoint"] == "" || tr.Metadata["lagThreshold"] == "" {
		t.Errorf("ScaledObject trigger: %+v", tr)
	}
}

func checkServiceMonitor(t *testing.T, js []byte) {
	t.Helper()
	var sm struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port     string `json:"port"`
				Path     string `json:"path"`
				Interval string `json:"interval"`
			} `json:"endpoints"`
		} `json:"spec"`
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sm); err != nil {
		t.Fatalf("ServiceMonitor: %v\n%s", err, js)
	}
	if len(sm.Spec.Selector.MatchLabels) == 0 || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" {
		t.Errorf("ServiceMonitor: %s", js)
	}
}

// TestChartRefusesBadValues: an unknown key and a missing existingSecret
// fail helm template, naming the key.
func TestChartRefusesBadValues(t *testing.T) {
	dir := chartCopy(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown top-level key", []string{"--set", "existingSecret=c", "--set", "replicaz=3"}, "replicaz"},
		{"unknown worker key", []string{"--set", "existingSecret=c", "--set", "worker.slotz=3"}, "slotz"},
		{"misplaced key", []string{"--set", "existingSecret=c", "--set", "worker.maxConcurrency=3"}, "maxConcurrency"},
		{"no existingSecret", nil, "existingSecret is required"},
		{"external NATS without a URL", []string{"--set", "existingSecret=c", "--set", "nats.enabled=false"}, "externalNats.url is required"},
		{"keda without the account", []string{"--set", "existingSecret=c", "--set", "keda.enabled=true"}, "keda.account is required"},
	}
	for _, c := range cases {
		out, err := helm(append([]string{"template", "fleet", dir}, c.args...)...)
		if err == nil {
			t.Errorf("%s: rendered:\n%s", c.name, out)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error does not name %q: %v", c.name, c.want, err)
		}
	}
}
