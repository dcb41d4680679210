package rdmadev

import (
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
)

// Device paths of the layouts below, relative to <Root>/devices.
const (
	mlxBridge = "pci0000:3a/0000:3a:00.0"
	mlxPF0    = mlxBridge + "/0000:3b:00.0"
	mlxPF1    = mlxBridge + "/0000:3b:00.1"
	mlxVF     = mlxBridge + "/0000:3b:00.2" // VFs are siblings of the PF
	mlxSF2    = mlxPF0 + "/mlx5_core.sf.2"
	mlxSF3    = mlxPF0 + "/mlx5_core.sf.3"

	iceBridge = "pci0000:46/0000:46:01.0"
	icePF0    = iceBridge + "/0000:47:00.0"
	icePF1    = iceBridge + "/0000:47:00.1"

	virtioFn1    = "pci0000:00/0000:00:04.0"
	virtioChild1 = virtioFn1 + "/virtio1"
	virtioFn2    = "pci0000:00/0000:00:05.0"
	virtioChild2 = virtioFn2 + "/virtio2"
)

// mlx5Card builds a two-port ConnectX card: PF0 with a sub-function SF2
// (with its RDMA device) and SF3 (without: its RDMA device is elsewhere),
// PF1, and a VF of PF0 with its own RDMA device. The auxiliary eth/rdma
// devices mlx5_core creates are present but, as on real hosts, parent
// neither the netdev nor the RDMA device.
func mlx5Card(t *testing.T) *sysfstest.Tree {
	tr := sysfstest.New(t)
	tr.Device("", "pci0000:3a")
	tr.PCI(mlxBridge)
	tr.PCI(mlxPF0)
	tr.Device("auxiliary", mlxPF0+"/mlx5_core.eth.0")
	tr.Device("auxiliary", mlxPF0+"/mlx5_core.rdma.0")
	tr.Netdev(mlxPF0, "ens1f0")
	tr.RDMA(mlxPF0, "mlx5_0")
	tr.PCI(mlxPF1)
	tr.Netdev(mlxPF1, "ens1f1")
	tr.RDMA(mlxPF1, "mlx5_1")
	tr.Device("auxiliary", mlxSF2)
	tr.Netdev(mlxSF2, "enp59s0f0s2")
	tr.RDMA(mlxSF2, "mlx5_2")
	tr.Device("auxiliary", mlxSF3)
	tr.Netdev(mlxSF3, "enp59s0f0s3")
	tr.PCI(mlxVF)
	tr.Netdev(mlxVF, "ens1f0v0")
	tr.RDMA(mlxVF, "mlx5_4")
	return tr
}

// e810Card builds an Intel E810 with irdma: each port's RDMA device sits
// under its PCI function next to the ice.roce.N auxiliary device, named by
// udev (rocep71s0f0) on one port and by the kernel (irdma1) on the other.
func e810Card(t *testing.T) *sysfstest.Tree {
	tr := sysfstest.New(t)
	tr.Device("", "pci0000:46")
	tr.PCI(iceBridge)
	tr.PCI(icePF0)
	tr.Device("auxiliary", icePF0+"/ice.roce.0")
	tr.Netdev(icePF0, "ens2f0")
	tr.RDMA(icePF0, "rocep71s0f0")
	tr.PCI(icePF1)
	tr.Device("auxiliary", icePF1+"/ice.roce.1")
	tr.Netdev(icePF1, "ens2f1")
	tr.RDMA(icePF1, "irdma1")
	return tr
}

// virtioVM builds a test VM with two virtio NICs and a soft-RoCE device on
// each; rxeUnderChild picks whether rdma_rxe parented them to the virtio
// child or to the PCI function.
func virtioVM(t *testing.T, rxeUnderChild bool) *sysfstest.Tree {
	tr := sysfstest.New(t)
	tr.Device("", "pci0000:00")
	for _, p := range []struct{ fn, child, netdev, rdma string }{
		{virtioFn1, virtioChild1, "eth1", "rxe0"},
		{virtioFn2, virtioChild2, "eth2", "rxe1"},
	} {
		tr.PCI(p.fn)
		tr.Device("virtio", p.child)
		tr.Netdev(p.child, p.netdev)
		if rxeUnderChild {
			tr.RDMA(p.child, p.rdma)
		} else {
			tr.RDMA(p.fn, p.rdma)
		}
	}
	return tr
}
