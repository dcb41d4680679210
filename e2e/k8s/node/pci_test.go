package node

import (
	"strings"
	"testing"
)

// The sysfs paths of the test VM's devices (vm-run.sh --pcie-roots: a pxb's
// bridge on its root bus, the NICs on the bridge's secondary bus) and of a
// ConnectX.
func TestPCIPaths(t *testing.T) {
	for _, c := range []struct{ path, root, fn string }{
		// A virtio NIC's netdev, and an rxe device of the child layout,
		// below the virtio device.
		{"/sys/devices/pci0000:10/0000:10:00.0/0000:11:01.0/virtio3", "pci0000:10", "0000:11:01.0"},
		// An rxe device of the pf layout; a stand-in GPU.
		{"/sys/devices/pci0000:20/0000:20:00.0/0000:21:1c.0", "pci0000:20", "0000:21:1c.0"},
		{"/sys/devices/pci0000:00/0000:00:04.0/virtio1", "pci0000:00", "0000:00:04.0"},
		// A ConnectX's netdev hangs off the function itself.
		{"/sys/devices/pci0000:3a/0000:3a:02.0/0000:3b:00.1", "pci0000:3a", "0000:3b:00.1"},
		{"/sys/devices/virtual/net/lo", "", ""},
		{"", "", ""},
	} {
		if got := PCIRoot(c.path); got != c.root {
			t.Errorf("PCIRoot(%q) = %q, want %q", c.path, got, c.root)
		}
		if got := PCIFunction(c.path); got != c.fn {
			t.Errorf("PCIFunction(%q) = %q, want %q", c.path, got, c.fn)
		}
	}
}

// pairsBoot is make e2e-k8s's pairs boot as /init and sysfs show it
// (vm-run.sh --nics 8 --pcie-roots 2 --standin-gpus 2): eth1..eth4 under
// the first root, eth5..eth7 under the second, two GPUs under each.
const pairsGPUs = "0000:11:1c.0 pci0000:10 0\n0000:11:1d.0 pci0000:10 0\n0000:21:1c.0 pci0000:20 1\n0000:21:1d.0 pci0000:20 1\n"

func pairsNICs() map[string]string {
	return map[string]string{
		"eth0": Bus0Root,
		"eth1": "pci0000:10", "eth2": "pci0000:10", "eth3": "pci0000:10", "eth4": "pci0000:10",
		"eth5": "pci0000:20", "eth6": "pci0000:20", "eth7": "pci0000:20",
	}
}

// The pairs boot's layout, and each part of it lost on the way: what
// -k8s.pairs-required fails the run with instead of TestDRAPairs
// skipping.
func TestPairsMissing(t *testing.T) {
	if why := pairsMissing(pairsGPUs, pairsNICs(), 2, 2); why != "" {
		t.Fatalf("the full layout: %q", why)
	}
	firstRootOnly := pairsNICs()
	for _, nd := range []string{"eth5", "eth6", "eth7"} {
		firstRootOnly[nd] = "pci0000:10"
	}
	bus0Only := map[string]string{"eth0": Bus0Root, "eth1": Bus0Root, "eth2": Bus0Root}
	for _, c := range []struct {
		name    string
		gpus    string
		nics    map[string]string
		want    []string
		wantNot string
	}{
		{"no GPU (no --standin-gpus)", "", pairsNICs(), []string{
			"/run/standin-gpus lists 0 GPUs, want 4 (vm-run.sh --pcie-roots 2 --standin-gpus 2)",
			"stand-in GPUs under no root, want 2 roots of 2 each",
		}, ""},
		{"GPUs missing (--standin-gpus 1)", "0000:11:1c.0 pci0000:10 0\n0000:21:1c.0 pci0000:20 1\n", pairsNICs(), []string{
			"lists 2 GPUs, want 4",
			"stand-in GPUs under pci0000:10 (1), pci0000:20 (1), want 2 roots of 2 each",
		}, "test NICs"},
		{"the GPUs under one root", strings.ReplaceAll(pairsGPUs, "pci0000:20 1", "pci0000:10 0"), pairsNICs(), []string{
			"stand-in GPUs under pci0000:10 (4), want 2 roots of 2 each",
		}, "lists"},
		{"the NICs under one root", pairsGPUs, firstRootOnly, []string{
			"test NICs under pci0000:10 (eth1 eth2 eth3 eth4 eth5 eth6 eth7) besides pci0000:00, want 2 roots (vm-run.sh --pcie-roots 2)",
		}, "GPUs"},
		{"no roots at all (no --pcie-roots)", "", bus0Only, []string{
			"lists 0 GPUs",
			"test NICs under no root besides pci0000:00, want 2 roots",
		}, ""},
		{"GPUs and NICs under other roots", strings.ReplaceAll(pairsGPUs, "pci0000:20", "pci0000:30"), pairsNICs(), []string{
			"stand-in GPUs under pci0000:30, where no test NIC is",
		}, "lists"},
		{"a line without its root", "0000:11:1c.0\n" + pairsGPUs[strings.Index(pairsGPUs, "\n")+1:], pairsNICs(), []string{
			`/run/standin-gpus line "0000:11:1c.0" is not PCI address, root, NUMA node`,
		}, ""},
	} {
		why := pairsMissing(c.gpus, c.nics, 2, 2)
		t.Logf("%s: %s", c.name, why)
		for _, w := range c.want {
			if !strings.Contains(why, w) {
				t.Errorf("%s: %q, want it to say %q", c.name, why, w)
			}
		}
		if c.wantNot != "" && strings.Contains(why, c.wantNot) {
			t.Errorf("%s: %q says %q of what is in place", c.name, why, c.wantNot)
		}
	}
}
