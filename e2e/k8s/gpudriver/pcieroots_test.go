package gpudriver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"
)

// The test VM's PCI functions with `scripts/vm-run.sh --pcie-roots 2
// --standin-gpus 2 --nics 5`, as the guest listed them (`readlink -f` of
// each /sys/bus/pci/devices entry, then its numa_node): two QEMU pxb
// roots, each with its PCI bridge, two NICs and two stand-in GPUs.
const pxbGuestFunctions = `
/sys/devices/pci0000:00/0000:00:03.0 -1
/sys/devices/pci0000:00/0000:00:04.0 -1
/sys/devices/pci0000:00/0000:00:05.0 -1
/sys/devices/pci0000:10/0000:10:00.0 0
/sys/devices/pci0000:10/0000:10:00.0/0000:11:01.0 0
/sys/devices/pci0000:10/0000:10:00.0/0000:11:02.0 0
/sys/devices/pci0000:10/0000:10:00.0/0000:11:1c.0 0
/sys/devices/pci0000:10/0000:10:00.0/0000:11:1d.0 0
/sys/devices/pci0000:20/0000:20:00.0 1
/sys/devices/pci0000:20/0000:20:00.0/0000:21:01.0 1
/sys/devices/pci0000:20/0000:20:00.0/0000:21:02.0 1
/sys/devices/pci0000:20/0000:20:00.0/0000:21:1c.0 1
/sys/devices/pci0000:20/0000:20:00.0/0000:21:1d.0 1
`

// The same guest's /run/standin-gpus: address, PCI root, NUMA node.
const pxbGuestStandinGPUs = `
0000:11:1c.0 pci0000:10 0
0000:11:1d.0 pci0000:10 0
0000:21:1c.0 pci0000:20 1
0000:21:1d.0 pci0000:20 1
`

func pxbGuestTree(t *testing.T) string {
	t.Helper()
	tree := sysfstest.New(t)
	for _, line := range strings.Split(strings.TrimSpace(pxbGuestFunctions), "\n") {
		path, numa, _ := strings.Cut(line, " ")
		dir := tree.PCI(strings.TrimPrefix(path, "/sys/devices/"))
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(numa+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return tree.Root
}

// Each stand-in GPU on the VM's pxb roots is published with the root and
// NUMA node the guest sees it on, so a claim's matchAttribute on pcieRoot
// can tell the two roots apart.
func TestStandinGPUsOnPxbRoots(t *testing.T) {
	var addrs, roots, numas []string
	for _, line := range strings.Split(strings.TrimSpace(pxbGuestStandinGPUs), "\n") {
		f := strings.Fields(line)
		addrs, roots, numas = append(addrs, f[0]), append(roots, f[1]), append(numas, f[2])
	}
	d, err := New(driverName, addrs, pxbGuestTree(t))
	if err != nil {
		t.Fatal(err)
	}
	for i, dev := range d.Devices() {
		root := dev.Attributes["resource.kubernetes.io/pcieRoot"]
		if root.StringValue == nil || *root.StringValue != roots[i] {
			t.Errorf("%s: pcieRoot %q, want %s", addrs[i], ptr.Deref(root.StringValue, "(none)"), roots[i])
		}
		numa := dev.Attributes["resource.kubernetes.io/numaNode"]
		if numa.IntValue == nil || strconv.FormatInt(*numa.IntValue, 10) != numas[i] {
			t.Errorf("%s: numaNode %d, want %s", addrs[i], ptr.Deref(numa.IntValue, -1), numas[i])
		}
	}
}

// The NICs the VM puts on a root share its pcieRoot with that root's
// GPUs and no other: eth1, eth2 on the first, eth3, eth4 on the second,
// eth0 on bus 0 (the guest's /run/rdma-layout, PCI column).
func TestNICsShareTheirRootWithItsGPUs(t *testing.T) {
	fsys := deviceattribute.WithFSFromRoot(pxbGuestTree(t))
	for nic, want := range map[string]string{
		"0000:00:03.0": "pci0000:00", // eth0
		"0000:11:01.0": "pci0000:10", // eth1
		"0000:11:02.0": "pci0000:10", // eth2
		"0000:21:01.0": "pci0000:20", // eth3
		"0000:21:02.0": "pci0000:20", // eth4
	} {
		got, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(nic, fsys)
		if err != nil {
			t.Errorf("%s: %v", nic, err)
			continue
		}
		if got.Value.StringValue == nil || *got.Value.StringValue != want {
			t.Errorf("%s: pcieRoot %q, want %s", nic, ptr.Deref(got.Value.StringValue, "(none)"), want)
		}
	}
}
