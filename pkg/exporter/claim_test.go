package exporter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

func claimOf(uid, ns, name, podNS, pod string, devs ...drarecord.Device) *drarecord.Claim {
	return &drarecord.Claim{Version: drarecord.Version, ClaimUID: uid, ClaimNamespace: ns, ClaimName: name,
		PodUID: "pod-" + uid, PodNamespace: podNS, PodName: pod, Devices: devs}
}

// claimSeries are the rdma_device_claim_info series, by host_device.
func claimSeries(fams map[string]*dto.MetricFamily) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, m := range fams["rdma_device_claim_info"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		out[l["host_device"]] = l
	}
	return out
}

// A device in a pod that a DRA record names for that pod is joined to its
// claim: by PCI address, or by the host's name where the plugin's record
// has no PCI address. A device on the host, one held by a pod the claim
// is not for, and one whose pod has no claim get no claim series, and
// the device metrics of all of them keep their labels.
func TestClaimInfo(t *testing.T) {
	r := &fakeReader{devices: map[string]map[string]DeviceStats{
		"":             {"rxe0": rxeStats("rxe0", "eth0", 1, 2)},
		"/run/netns/a": {"rxe2": rxeStats("rxe2", "net1", 3, 4)},
		"/run/netns/b": {"rdma_net1": rxeStats("rdma_net1", "net1", 5, 6)},
		"/run/netns/c": {"rxe6": rxeStats("rxe6", "net1", 7, 8)},
	}}
	recA := &state.Record{Device: "rxe2", PCIAddress: "0000:00:04.0", Netns: "/run/netns/a", K8sNamespace: "team-a", K8sPod: "trainer-0"}
	recB := &state.Record{Device: "rxe4", PodName: "rdma_net1", Netns: "/run/netns/b", K8sNamespace: "team-b", K8sPod: "trainer-1"}
	recC := &state.Record{Device: "rxe6", PCIAddress: "0000:00:06.0", Netns: "/run/netns/c", K8sNamespace: "team-c", K8sPod: "plain"}
	inv := nodeWith([]string{"/run/netns/a", "/run/netns/b", "/run/netns/c"}, recA, recB, recC)
	inv.targets.Claims = []*drarecord.Claim{
		claimOf("u1", "team-a", "trainer-0-nics-x7", "team-a", "trainer-0",
			drarecord.Device{Request: "nics", PCIAddress: "0000:00:04.0", RdmaDevice: "rxe2"}),
		claimOf("u2", "team-b", "shared-nic", "team-b", "trainer-1",
			drarecord.Device{Request: "nics/fast", PCIAddress: "0000:00:05.0", RdmaDevice: "rxe4"}),
		// The host's NIC, claimed for a pod whose sandbox has not attached it.
		claimOf("u3", "team-d", "waiting", "team-d", "starting",
			drarecord.Device{Request: "nics", PCIAddress: "0000:00:03.0", RdmaDevice: "rxe0"}),
		// rxe6's PCI address, claimed for another pod than the one holding it.
		claimOf("u4", "team-e", "other", "team-e", "someone",
			drarecord.Device{Request: "nics", PCIAddress: "0000:00:06.0", RdmaDevice: "rxe6"}),
	}
	fams := scrape(t, NewCollector(inv, r))

	want := map[string]map[string]string{
		"rxe2": {"device": "rxe2", "host_device": "rxe2", "namespace": "team-a", "pod": "trainer-0",
			"claim_namespace": "team-a", "claim_name": "trainer-0-nics-x7", "request": "nics"},
		"rxe4": {"device": "rdma_net1", "host_device": "rxe4", "namespace": "team-b", "pod": "trainer-1",
			"claim_namespace": "team-b", "claim_name": "shared-nic", "request": "nics/fast"},
	}
	got := claimSeries(fams)
	if len(got) != len(want) {
		t.Errorf("claim series %v, want %v", got, want)
	}
	for dev, w := range want {
		for k, v := range w {
			if got[dev][k] != v {
				t.Errorf("%s: claim series %v, want %v", dev, got[dev], w)
				break
			}
		}
		if value(t, fams, "rdma_device_claim_info", w) != 1 {
			t.Errorf("%s: claim series is not 1", dev)
		}
	}
	if typ := fams["rdma_device_claim_info"].GetType(); typ != dto.MetricType_GAUGE {
		t.Errorf("rdma_device_claim_info is a %v, want a gauge", typ)
	}
	// The device metrics carry no claim label: their series are the same
	// with or without DRA.
	for _, name := range []string{"rdma_port_hw_stat_total", "rdma_device_resources", "rdma_port_state"} {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetName(), "claim") {
					t.Errorf("%s carries %s", name, l.GetName())
				}
			}
		}
	}
}

// A damaged DRA record costs its claim series only, and is counted as a
// read error; the whole records still name their claims.
func TestReadClaims(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dra")
	if claims, err := readClaims(dir); err != nil || len(claims) != 0 {
		t.Errorf("absent dir: %v, %v", claims, err)
	}
	c := claimOf("u1", "team-a", "c", "team-a", "p", drarecord.Device{Request: "nics", PCIAddress: "0000:00:04.0"})
	if err := drarecord.Dir(dir).Write(c); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "u9.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	claims, err := readClaims(dir)
	if len(claims) != 1 || claims[0].ClaimName != "c" || err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("readClaims = %v, %v; want claim c and an error naming %s", claims, err, bad)
	}
}
