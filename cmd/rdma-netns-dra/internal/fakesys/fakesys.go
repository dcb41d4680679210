// Package fakesys builds, for tests, the sysfs of a node with two RDMA
// NICs under two PCIe root complexes, laid out as the kernel does.
package fakesys

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
)

// The node's NICs.
const (
	// VirtioAddr is a virtio-net NIC with soft-RoCE, as in the test VM:
	// the netdev hangs off virtio2 and so does rxe0. No NUMA affinity.
	VirtioAddr   = "0000:00:05.0"
	VirtioDevice = "pci-0000-00-05-0"
	VirtioNetdev = "eth1"
	VirtioRDMA   = "rxe0"
	// MlxAddr is an mlx5-like NIC: netdev and RDMA device on the PCI
	// function itself, on NUMA node 1, behind another root complex.
	MlxAddr   = "0000:10:03.0"
	MlxDevice = "pci-0000-10-03-0"
	MlxNetdev = "ens3"
	MlxRDMA   = "mlx5_0"
)

// Node is the fake sysfs.
type Node struct {
	*sysfstest.Tree
	tb testing.TB
}

// New builds the node.
func New(tb testing.TB) *Node {
	tb.Helper()
	n := &Node{Tree: sysfstest.New(tb), tb: tb}
	virtioFn := "pci0000:00/" + VirtioAddr
	n.PCI(virtioFn)
	n.Device("virtio", virtioFn+"/virtio2")
	n.Netdev(virtioFn+"/virtio2", VirtioNetdev)
	n.RDMA(virtioFn+"/virtio2", VirtioRDMA)
	n.File(virtioFn+"/numa_node", "-1")
	n.File(virtioFn+"/vendor", "0x1af4")
	n.File(virtioFn+"/device", "0x1000")
	n.class("net", VirtioNetdev, "speed", "-1")
	n.class("infiniband", VirtioRDMA, "ports/1/link_layer", "Ethernet")
	n.class("infiniband", VirtioRDMA, "ports/1/state", "4: ACTIVE")

	mlxFn := "pci0000:10/0000:10:00.0/" + MlxAddr
	n.PCI("pci0000:10/0000:10:00.0")
	n.PCI(mlxFn)
	n.Netdev(mlxFn, MlxNetdev)
	n.RDMA(mlxFn, MlxRDMA)
	n.File(mlxFn+"/numa_node", "1")
	n.File(mlxFn+"/vendor", "0x15b3")
	n.File(mlxFn+"/device", "0x101d")
	n.class("net", MlxNetdev, "speed", "100000")
	n.class("infiniband", MlxRDMA, "ports/1/link_layer", "Ethernet")
	n.class("infiniband", MlxRDMA, "ports/1/state", "1: DOWN")
	return n
}

// File writes a file below <Root>/devices.
func (n *Node) File(rel, data string) {
	n.tb.Helper()
	n.write(n.Path(rel), data)
}

func (n *Node) class(class, dev, rel, data string) {
	n.tb.Helper()
	n.write(filepath.Join(n.Root, "class", class, dev, rel), data)
}

func (n *Node) write(path, data string) {
	n.tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		n.tb.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data+"\n"), 0o644); err != nil {
		n.tb.Fatal(err)
	}
}

// Hold makes the NIC at addr vanish from the host as a pod's ADD does:
// its netdev and RDMA device leave for the pod's netns; the PCI function
// stays.
func (n *Node) Hold(netdev, rdma string) {
	n.tb.Helper()
	n.Remove("net", netdev)
	n.Remove("infiniband", rdma)
}
