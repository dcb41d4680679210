package exporter

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// promtool is Prometheus's own linter of the exposition (names, units,
// HELP and TYPE): $PROMTOOL, else promtool on PATH. make unit sets
// PROMTOOL to the one scripts/promtool.sh unpacks from Debian's
// prometheus package; under CI (CI=true) a missing promtool fails the
// test rather than skipping it.
func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv("PROMTOOL")
	if p == "" {
		p, _ = exec.LookPath("promtool")
	}
	if p == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (PROMTOOL unset, none on PATH): run make unit, which sets PROMTOOL from scripts/promtool.sh, or install Debian's prometheus package")
		}
		t.Skip("promtool not found: make unit sets PROMTOOL (scripts/promtool.sh), or install Debian's prometheus package")
	}
	return p
}

// The exposition a node serves, with devices on the host and in pods,
// hardware and standard port counters, resources, a device's claim and
// the exporter's own metrics, is clean for `promtool check metrics`.
func TestPromtoolCheckMetrics(t *testing.T) {
	bin := promtool(t)
	pod := rxeStats("rdma_net1", "net1", 5, 6)
	pod.Ports[0].Counters = map[string]uint64{"port_xmit_data": 1000, "port_rcv_data": 2000, "port_xmit_packets": 10}
	r := &fakeReader{devices: map[string]map[string]DeviceStats{
		"":             {"rxe0": rxeStats("rxe0", "eth0", 1, 2)},
		"/run/netns/a": {"rdma_net1": pod},
	}}
	rec := &state.Record{Device: "rxe4", PodName: "rdma_net1", Netns: "/run/netns/a", K8sNamespace: "team-a", K8sPod: "trainer-0"}
	inv := nodeWith([]string{"/run/netns/a"}, rec)
	inv.targets.Claims = []*drarecord.Claim{claimOf("u1", "team-a", "trainer-0-nics", "team-a", "trainer-0",
		drarecord.Device{Request: "nics", PCIAddress: "0000:00:04.0", RdmaDevice: "rxe4"})}
	srv := httptest.NewServer(Handler(NewCollector(inv, r), nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s (%v)\n%s", resp.Status, err, body)
	}
	if !bytes.Contains(body, []byte(`pod="trainer-0"`)) || !bytes.Contains(body, []byte("rdma_port_stat_total")) || !bytes.Contains(body, []byte("rdma_device_claim_info{")) {
		t.Fatalf("/metrics lacks the pod's device, its port counters or its claim:\n%s", body)
	}
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("%s check metrics: %v\n%s\nexposition:\n%s", bin, err, out, body)
	}
}
