//go:build e2e

package k8s

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// conf/nad-device-info.yaml and conf/pod-device-info.yaml (overlays: the
// VM's PCI address and node, static IPAM, the tools image): the pod names
// its NIC by PCI address, Multus hands that deviceID to host-device and
// rdma-netns and passes a device-info file, and the network-status
// annotation, read from the API server, carries device-info of type pci
// with that address and the NIC's RDMA device, which the pod's netns
// holds. Deleting the pod returns it.
func TestDeviceInfo(t *testing.T) {
	const ns, name, network = "default", "rdma-devinfo-0", "default/rdma-net-devinfo"
	applyManifest(t, "nad-device-info")
	applyManifest(t, "pod-device-info")
	// --grace-period=1: the pod's `sleep infinity`, its PID 1, ignores
	// SIGTERM, and the default 30 s would only be waited out.
	grace := metav1.DeleteOptions{GracePeriodSeconds: new(int64(1))}
	t.Cleanup(func() { deletePod(t, ns, name, grace) })

	pci := selectedDeviceID(t, ns, name)
	nic := nicAt(t, pci)
	took := waitRunning(t, ns, name, 3*time.Minute)
	t.Logf("pod Running %s after create, on %s (%s, %s) by deviceID", took.Round(time.Millisecond), pci, nic.Netdev, nic.RDMA)

	status, raw := networkStatus(t, ns, name)
	t.Logf("network-status: %s", strings.Join(strings.Fields(raw), " "))
	net1 := attachment(status, network, "net1")
	switch {
	case net1 == nil:
		t.Fatalf("network-status has no net1 of %s:\n%s", network, raw)
	case net1.DeviceInfo == nil || net1.DeviceInfo.PCI == nil:
		t.Fatalf("network-status of %s has no pci device-info:\n%s", network, raw)
	}
	di := net1.DeviceInfo
	if di.Type != "pci" || di.PCI.Address != pci || di.PCI.RDMADevice != nic.RDMA {
		t.Errorf("device-info type %q pci-address %q rdma-device %q, want pci %s %s:\n%s",
			di.Type, di.PCI.Address, di.PCI.RDMADevice, pci, nic.RDMA, raw)
	}

	netns, err := ctd.PodNetns(ctx(t), sandboxOf(t, ns, name).Id)
	if err != nil {
		t.Fatal(err)
	}
	if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != nic.RDMA {
		t.Errorf("pod's netns has RDMA devices %v (%v), want [%s]", in, err, nic.RDMA)
	}
	deletePod(t, ns, name, grace)
	waitHome(t, nic.RDMA)
}

// selectedDeviceID is the deviceID of the pod's network-selection element,
// as the API server has it.
func selectedDeviceID(t *testing.T, ns, name string) string {
	t.Helper()
	pod, err := cs.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw := pod.Annotations["k8s.v1.cni.cncf.io/networks"]
	var sel []struct {
		DeviceID string `json:"deviceID"`
	}
	if err := json.Unmarshal([]byte(raw), &sel); err != nil || len(sel) != 1 || sel[0].DeviceID == "" {
		t.Fatalf("pod %s/%s: networks annotation %q (%v), want one element with a deviceID", ns, name, raw, err)
	}
	return sel[0].DeviceID
}

// nicAt is the VM NIC at a PCI address.
func nicAt(t *testing.T, pci string) rig.NIC {
	t.Helper()
	return vmNIC(t, func(n rig.NIC) bool { return n.PCI == pci }, fmt.Sprintf("at %s (%s)", pci, rig.LayoutF))
}
