package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// clusterNodeConf is one node of the benchmark's 3-node cluster: as
// deploy/nats/cluster/node.conf (JetStream, a cluster named fleet, routes
// to all three nodes on loopback) without its accounts. Client and
// monitoring ports are picked by the server (written to the ports file);
// the route ports, which every node must know beforehand, by the harness.
const clusterNodeConf = `server_name: %s
host: 127.0.0.1
port: -1
http_port: -1
ports_file_dir: %q
max_payload: 1MB
jetstream { store_dir: %q, max_file_store: 100GB, max_memory_store: 2GB }
cluster {
  name: fleet
  host: 127.0.0.1
  port: %s
  routes: [%s]
}
`

// startNATSCluster starts three nats-server processes of bin as one
// JetStream cluster, sets fp's nats (the first node), natsPeers and
// natsMonitor (the first node's), and returns every node's client URL,
// comma-separated, once every node knows a meta leader of three. A route
// port picked is free when picked, not when bound: if a node finds its
// taken, the three start again on new ones, up to three times.
func startNATSCluster(t testing.TB, fp *fleetProcs, bin, dir string) string {
	for try := 1; ; try++ {
		nodes, urls, monitors, err := startNodes(t, bin, filepath.Join(dir, "try-"+strconv.Itoa(try)))
		if err != nil {
			for _, p := range nodes {
				_ = p.Process.Kill()
				<-p.exited
			}
			if try == 3 || !strings.Contains(err.Error(), "address already in use") {
				t.Fatal(err)
			}
			t.Logf("a route port was taken before a node bound it; starting the cluster again")
			continue
		}
		fp.nats, fp.natsPeers, fp.natsMonitor = nodes[0], nodes[1:], monitors[0]
		for i, p := range nodes {
			require.NoError(t, p.waitReady(t, func() bool { return metaFormed(monitors[i]) }))
		}
		return strings.Join(urls, ",")
	}
}

// startNodes starts the three nodes under dir and waits for their ports
// files; err is a node's exit before that.
func startNodes(t testing.TB, bin, dir string) (nodes []*proc, urls, monitors []string, err error) {
	routePorts := make([]string, 3)
	routes := make([]string, 3)
	for i := range routePorts {
		addr := freePort(t)
		routePorts[i] = addr[strings.LastIndexByte(addr, ':')+1:]
		routes[i] = "nats-route://" + addr
	}
	for i := range 3 {
		name := "bench-nats-" + strconv.Itoa(i+1)
		ndir := filepath.Join(dir, name)
		portsDir := filepath.Join(ndir, "ports")
		require.NoError(t, os.MkdirAll(portsDir, 0o755))
		conf := filepath.Join(ndir, "node.conf")
		require.NoError(t, os.WriteFile(conf, fmt.Appendf(nil, clusterNodeConf, name, portsDir,
			filepath.Join(ndir, "store"), routePorts[i], strings.Join(routes, ", ")), 0o600))
		nodes = append(nodes, startProc(t, name, filepath.Join(ndir, "nats.log"), bin, "-c", conf))
	}
	for _, p := range nodes {
		portsFile := filepath.Join(filepath.Dir(p.log), "ports", fmt.Sprintf("nats-server_%d.ports", p.Process.Pid))
		var ports natsPorts
		if err := p.waitReady(t, func() bool {
			var ok bool
			ports, ok = readPorts(t, portsFile)
			return ok
		}); err != nil {
			return nodes, nil, nil, err
		}
		urls = append(urls, ports.Nats[0])
		monitors = append(monitors, strings.TrimPrefix(ports.Monitoring[0], "http://"))
	}
	return nodes, urls, monitors, nil
}

// metaFormed reports whether the node whose monitor is at addr knows a
// meta leader of a 3-node JetStream cluster and answers healthy (R3
// streams cannot be placed before).
func metaFormed(addr string) bool {
	if !httpOK("http://" + addr + "/healthz") {
		return false
	}
	resp, err := client.Get("http://" + addr + "/jsz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var v struct {
		Meta *struct {
			Leader string `json:"leader"`
			Size   int    `json:"cluster_size"`
		} `json:"meta_cluster"`
	}
	return json.NewDecoder(resp.Body).Decode(&v) == nil && v.Meta != nil && v.Meta.Leader != "" && v.Meta.Size == 3
}
