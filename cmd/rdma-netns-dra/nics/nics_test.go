package nics_test

import (
	"reflect"
	"testing"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/internal/fakesys"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
)

func TestScanFindsBothLayouts(t *testing.T) {
	node := fakesys.New(t)
	got, skipped, err := nics.Scanner{Root: node.Root}.Scan()
	if err != nil {
		t.Fatal(err)
	}
	one := int64(1)
	want := []nics.NIC{
		{PCIAddress: fakesys.VirtioAddr, Netdev: fakesys.VirtioNetdev, RdmaDevice: fakesys.VirtioRDMA, LinkLayer: "Ethernet", PortState: "ACTIVE",
			PCIVendor: "0x1af4", PCIDevice: "0x1000", PCIeRoot: "pci0000:00"},
		{PCIAddress: fakesys.MlxAddr, Netdev: fakesys.MlxNetdev, RdmaDevice: fakesys.MlxRDMA, LinkLayer: "Ethernet", PortState: "DOWN", SpeedMbps: 100000,
			PCIVendor: "0x15b3", PCIDevice: "0x101d", PCIeRoot: "pci0000:10", NUMANode: &one},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Scan:\n got %+v\nwant %+v", got, want)
	}
	if len(skipped) != 0 {
		t.Errorf("skipped %+v, want none", skipped)
	}
}

// A NIC whose netdev a pod holds while its RDMA device is still in the
// host (between the two moves of an ADD) is not offered: a pod could not
// get it whole.
func TestScanSkipsNICWithoutNetdev(t *testing.T) {
	node := fakesys.New(t)
	node.Remove("net", fakesys.MlxNetdev)
	got, skipped, err := nics.Scanner{Root: node.Root}.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].PCIAddress != fakesys.VirtioAddr {
		t.Errorf("Scan = %+v, want only %s", got, fakesys.VirtioAddr)
	}
	if len(skipped) != 1 || skipped[0].PCIAddress != fakesys.MlxAddr || skipped[0].RdmaDevice != fakesys.MlxRDMA {
		t.Errorf("skipped = %+v, want %s (%s)", skipped, fakesys.MlxAddr, fakesys.MlxRDMA)
	}
}

// --pci-addresses: only the NICs it lists are offered, so that NICs a
// device plugin or a pinned NAD hands out on the same node are never
// offered twice.
func TestScanOnlyListedNICs(t *testing.T) {
	node := fakesys.New(t)
	got, skipped, err := nics.Scanner{Root: node.Root, Only: map[string]bool{fakesys.MlxAddr: true}}.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].PCIAddress != fakesys.MlxAddr {
		t.Errorf("Scan = %+v, want only %s", got, fakesys.MlxAddr)
	}
	if len(skipped) != 1 || skipped[0].PCIAddress != fakesys.VirtioAddr || skipped[0].Reason != "not in --pci-addresses" {
		t.Errorf("skipped = %+v, want %s, not listed", skipped, fakesys.VirtioAddr)
	}
}
