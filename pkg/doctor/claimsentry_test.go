package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

func claimsEntryFinding(r *Report) *Finding {
	for _, f := range r.Findings {
		if f.Check == "claims-entry" {
			return &f
		}
	}
	return nil
}

// The claims entry is judged against its binary and the claims that need
// it: an entry naming a missing plugin fails every pod of the node, a
// claim that attaches by itself without the entry leaves its pod without
// NICs, and a node with neither is not told about it.
func TestNodeClaimsEntry(t *testing.T) {
	f, dir := draFixture(t)
	conf, bin := t.TempDir(), t.TempDir()
	f.env.CNIConfDir, f.env.CNIBinDir = conf, bin
	primary := filepath.Join(conf, "10-cluster.conflist")
	write(t, primary, `{"cniVersion": "1.0.0", "name": "cluster", "plugins": [{"type": "ptp"}]}`)

	if fd := claimsEntryFinding(CheckNode(f.env)); fd != nil {
		t.Errorf("no entry, no claim needing one: %+v", fd)
	}
	c := &drarecord.Claim{Version: drarecord.Version, ClaimUID: "u-1", ClaimNamespace: "team", ClaimName: "rails", PodUID: "p-1",
		PodNamespace: "team", PodName: "trainer", Attach: true,
		Devices: []drarecord.Device{{Request: "rails", Pool: "node-1", Device: "pci-x", PCIAddress: "0000:00:03.0", Netdev: "eth9", RdmaDevice: "mlx5_0",
			Config: &drarecord.NIC{InterfaceName: "rail0"}}}}
	if err := drarecord.Dir(dir).Write(c); err != nil {
		t.Fatal(err)
	}
	if fd := claimsEntryFinding(CheckNode(f.env)); fd == nil || fd.Severity != Fail || !strings.Contains(fd.Reason, "team/rails") || !strings.Contains(fd.Reason, "lacks") {
		t.Errorf("a claim that attaches by itself, no entry: %+v", fd)
	}

	write(t, primary, `{"cniVersion": "1.0.0", "name": "cluster", "plugins": [{"type": "ptp"}, {"type": "rdma-netns", "claims": true}]}`)
	if fd := claimsEntryFinding(CheckNode(f.env)); fd == nil || fd.Severity != Fail || !strings.Contains(fd.Reason, "every pod sandbox on this node fails") ||
		!strings.Contains(fd.Remedy, "--remove-claims-entry") {
		t.Errorf("an entry without its binary: %+v", fd)
	}
	if err := os.WriteFile(filepath.Join(bin, "rdma-netns"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if fd := claimsEntryFinding(CheckNode(f.env)); fd == nil || fd.Severity != OK || !strings.Contains(fd.Reason, "1 prepared claim(s) use it") {
		t.Errorf("the entry and its binary: %+v", fd)
	}
}
