package node

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
)

// StandinGPUsFile lists the VM's stand-in GPUs (vm-run.sh --standin-gpus,
// written by the guest's /init): PCI address, PCI root, NUMA node per line.
const StandinGPUsFile = "/run/standin-gpus"

// Bus0Root is the root of bus 0, where eth0 and the API's NIC sit beside
// the host bridge: never one of vm-run.sh --pcie-roots's.
const Bus0Root = "pci0000:00"

// PCIRoot is the PCIe root a resolved sysfs device path is under
// (/sys/devices/pci0000:10/0000:10:00.0/0000:11:01.0 is under pci0000:10),
// "" if none.
func PCIRoot(path string) string {
	for _, el := range strings.Split(path, "/") {
		if strings.HasPrefix(el, "pci") && strings.Contains(el, ":") {
			return el
		}
	}
	return ""
}

// PCIFunction is the nearest PCI function at or above a resolved sysfs
// device path, "" if none: a virtio NIC's netdev, and an rxe device of
// the child layout, hang off the virtio device below the function; a
// ConnectX's netdev and an rxe device of the pf layout off the function
// itself. By name, as a pod's readlink prints it (rdmadev's PCIAddressOf
// reads the subsystem links, which a path from a pod does not come with).
func PCIFunction(path string) string {
	els := strings.Split(path, "/")
	for i := len(els) - 1; i >= 0; i-- {
		if rdmadev.IsPCIAddress(els[i]) {
			return els[i]
		}
	}
	return ""
}

// PCIRootOf is the PCIe root of the PCI function pci, from its sysfs path.
func PCIRootOf(pci string) (string, error) {
	path, err := filepath.EvalSymlinks("/sys/bus/pci/devices/" + pci)
	if err != nil {
		return "", err
	}
	if root := PCIRoot(path); root != "" {
		return root, nil
	}
	return "", fmt.Errorf("PCI function %s: no PCIe root in its sysfs path %s", pci, path)
}

// PairsLayoutMissing says what this VM lacks of the alignment layout of
// make e2e-k8s's pairs boot (vm-run.sh --pcie-roots roots --standin-gpus
// perRoot): perRoot stand-in GPUs under each of roots PCIe roots, the test
// NICs under the same roots; "" when it has it all.
func PairsLayoutMissing(roots, perRoot int) string {
	gpus, err := os.ReadFile(StandinGPUsFile)
	if err != nil {
		return fmt.Sprintf("no stand-in GPUs: %v (vm-run.sh --pcie-roots %d --standin-gpus %d)", err, roots, perRoot)
	}
	nics, err := rig.Layout()
	if err != nil {
		return err.Error()
	}
	nicRoots := map[string]string{}
	for _, n := range nics {
		root, err := PCIRootOf(n.PCI)
		if err != nil {
			return fmt.Sprintf("%s: %v", n.Netdev, err)
		}
		nicRoots[n.Netdev] = root
	}
	return pairsMissing(string(gpus), nicRoots, roots, perRoot)
}

// pairsMissing is PairsLayoutMissing of StandinGPUsFile's contents and the
// test NICs' roots by netdev.
func pairsMissing(gpuList string, nicRoots map[string]string, roots, perRoot int) string {
	var why []string
	gpusUnder := map[string][]string{}
	n := 0
	for _, l := range strings.Split(gpuList, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		n++
		if len(f) < 2 {
			why = append(why, fmt.Sprintf("%s line %q is not PCI address, root, NUMA node", StandinGPUsFile, l))
			continue
		}
		gpusUnder[f[1]] = append(gpusUnder[f[1]], f[0])
	}
	if n != roots*perRoot {
		why = append(why, fmt.Sprintf("%s lists %d GPUs, want %d (vm-run.sh --pcie-roots %d --standin-gpus %d)", StandinGPUsFile, n, roots*perRoot, roots, perRoot))
	}
	if len(gpusUnder) != roots || slices.ContainsFunc(slices.Collect(maps.Values(gpusUnder)), func(g []string) bool { return len(g) != perRoot }) {
		why = append(why, fmt.Sprintf("stand-in GPUs under %s, want %d roots of %d each", countsText(gpusUnder), roots, perRoot))
	}
	nicsUnder := map[string][]string{}
	for nd, root := range nicRoots {
		if root != Bus0Root {
			nicsUnder[root] = append(nicsUnder[root], nd)
		}
	}
	if len(nicsUnder) != roots {
		why = append(why, fmt.Sprintf("test NICs under %s besides %s, want %d roots (vm-run.sh --pcie-roots %d)", membersText(nicsUnder), Bus0Root, roots, roots))
	} else {
		// The pairs are GPU and NIC under one root: a GPU under a root
		// without NICs has none to pair with.
		for _, root := range slices.Sorted(maps.Keys(gpusUnder)) {
			if nicsUnder[root] == nil {
				why = append(why, fmt.Sprintf("stand-in GPUs under %s, where no test NIC is (NICs under %s)", root, membersText(nicsUnder)))
			}
		}
	}
	return strings.Join(why, "; ")
}

// countsText is "root (count), ..." in root order, "no root" when empty.
func countsText(under map[string][]string) string {
	return underText(under, func(m []string) string { return fmt.Sprint(len(m)) })
}

// membersText is "root (member member), ..." in root order.
func membersText(under map[string][]string) string {
	return underText(under, func(m []string) string { return strings.Join(slices.Sorted(slices.Values(m)), " ") })
}

func underText(under map[string][]string, of func([]string) string) string {
	if len(under) == 0 {
		return "no root"
	}
	var s []string
	for _, root := range slices.Sorted(maps.Keys(under)) {
		s = append(s, fmt.Sprintf("%s (%s)", root, of(under[root])))
	}
	return strings.Join(s, ", ")
}
