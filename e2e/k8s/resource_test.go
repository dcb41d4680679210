//go:build e2e

package k8s

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/deviceplugin"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// nicResource is the resource the suite's device plugin hands NICs out as.
const nicResource = "rdma-netns.io/e2e_nic"

// One pod, two attachments of one device plugin resource, as an SR-IOV
// pod with two VFs has: a device plugin (ours, on kubelet's device plugin
// API: sriov-network-device-plugin cannot be installed here) hands out two
// NICs by PCI address; two NADs each name the resource and rename their
// RDMA device (rdma_a, rdma_b). Multus reads the pod's allocation from
// kubelet and gives each attachment one address, in the order it sorts
// them (v4.3 sorts them as strings); host-device takes that NIC as net1 or
// net2 and rdma-netns its RDMA device. Asked of the kernel inside the pod:
// each renamed device's RoCE netdev is its own attachment's interface,
// and that is the NIC whose address the attachment was given. The pod is
// run with the networks in both orders; each delete returns both NICs and
// devices.
func TestTwoNICsOfOneResource(t *testing.T) {
	nics := []rig.NIC{nicNamed(t, "eth6"), nicNamed(t, "eth7")}
	dp, err := deviceplugin.New(nicResource, []string{nics[0].PCI, nics[1].PCI}, pluginapi.DevicePluginPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Stop)
	waitAllocatable(t, nicResource, 2)

	nets := map[string]string{"dp-a": "rdma_a", "dp-b": "rdma_b"}
	nad(t, "default", "dp-a", "", "10.100.121.1/29", `, "rdmaDevName": "rdma_a", "capabilities": {"CNIDeviceInfoFile": true}`, byResource(nicResource))
	nad(t, "default", "dp-b", "", "10.100.122.1/29", `, "rdmaDevName": "rdma_b", "capabilities": {"CNIDeviceInfoFile": true}`, byResource(nicResource))
	netdevs, rdma := hostState(t)

	for i, order := range [][]string{{"dp-a", "dp-b"}, {"dp-b", "dp-a"}} {
		name := fmt.Sprintf("two-nics-%d", i)
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			pod := toolsPod("default", name, strings.Join(order, ","))
			pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{nicResource: resource.MustParse("2")}
			createPod(t, pod)
			took := waitRunning(t, pod.Namespace, pod.Name, 3*time.Minute)
			allocs := dp.Allocated()
			t.Logf("pod Running %s after create; the device plugin allocated %v", took.Round(time.Millisecond), allocs[len(allocs)-1])
			checkAttachments(t, pod, order, nets, nics)
			deletePod(t, pod.Namespace, pod.Name, metav1.DeleteOptions{})
			waitHostState(t, netdevs, rdma)
		})
	}
}

// checkAttachments checks each attachment of pod (networks in order) as
// the kernel inside the pod sees it: its interface is a NIC of the
// resource at the address Multus handed it, and the RDMA device its NAD
// renamed is that NIC's (its RoCE netdev is the interface), alone with the
// other attachment's in the pod.
func checkAttachments(t *testing.T, pod *corev1.Pod, order []string, devName map[string]string, nics []rig.NIC) {
	t.Helper()
	status, raw := networkStatus(t, pod.Namespace, pod.Name)
	t.Logf("network-status: %s", strings.Join(strings.Fields(raw), " "))
	netns := mustNetns(t, pod.Namespace, pod.Name)
	byName, err := rig.NICsByNameIn(nics, netns)
	if err != nil {
		t.Fatal(err)
	}
	ndevs := roceNetdevs(t, pod)
	var pcis, want []string
	for i, network := range order {
		iface := fmt.Sprintf("net%d", i+1)
		a := attachment(status, "default/"+network, iface)
		nic, ok := byName[iface]
		switch {
		case a == nil:
			t.Errorf("network-status has no %s on %s:\n%s", network, iface, raw)
			continue
		case !ok:
			t.Errorf("%s (%s) in the pod is no NIC of %s %v: %v", iface, network, nicResource, nics, byName)
			continue
		case a.DeviceInfo == nil || a.DeviceInfo.PCI == nil || a.DeviceInfo.PCI.Address != nic.PCI:
			t.Errorf("%s's %s is the NIC at %s, but its device-info says %+v", network, iface, nic.PCI, a.DeviceInfo)
		}
		if got := ndevs[devName[network]]; got != iface {
			t.Errorf("%s's RDMA device %s has RoCE netdev %q in the pod, want %s (%s, %s)", network, devName[network], got, iface, nic.PCI, nic.RDMA)
		}
		t.Logf("%s: %s = %s (%s), RDMA %s as %s", network, iface, nic.PCI, nic.Netdev, nic.RDMA, devName[network])
		pcis = append(pcis, nic.PCI)
		want = append(want, devName[network])
	}
	if slices.Sort(pcis); len(pcis) != 2 || pcis[0] == pcis[1] {
		t.Errorf("the attachments have NICs %v, want the resource's two", pcis)
	}
	slices.Sort(want)
	if in, err := rig.RDMAIn(netns); err != nil || !slices.Equal(in, want) {
		t.Errorf("pod's netns has RDMA devices %v (%v), want %v", in, err, want)
	}
	for _, n := range nics {
		if rig.HostHas(t, n.RDMA) {
			t.Errorf("%s is still on the host with the pod running", n.RDMA)
		}
	}
}

// roceNetdevs maps each RDMA device the pod's container sees to the
// netdev of its port 1's first GID, read by the container in its own
// sysfs: the kernel's pairing of a RoCE device with its Ethernet port.
func roceNetdevs(t *testing.T, pod *corev1.Pod) map[string]string {
	t.Helper()
	out, stderr, err := execIn(t, pod.Namespace, pod.Name, "tools", "sh", "-c",
		`for d in /sys/class/infiniband/*; do echo "${d##*/} $(cat $d/ports/1/gid_attrs/ndevs/0)"; done`)
	if err != nil {
		t.Fatalf("read the RoCE netdevs in %s: %v\n%s", pod.Name, err, stderr)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m
}

// waitAllocatable waits until the node offers n of resource, which
// kubelet reports once the device plugin has registered and listed them.
func waitAllocatable(t *testing.T, res string, n int64) {
	t.Helper()
	var have resource.Quantity
	err := cririg.Wait(2*time.Minute, fmt.Sprintf("the node's allocatable %s to be %d", res, n), func() (bool, error) {
		nd, err := cs.CoreV1().Nodes().Get(ctx(t), node.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		have = nd.Status.Allocatable[corev1.ResourceName(res)]
		return have.Value() == n, nil
	})
	if err != nil {
		t.Fatalf("%v: it is %s", err, have.String())
	}
}
