//go:build e2e

package k8s

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// nad is a NetworkAttachmentDefinition in namespace ns whose chain is
// host-device on netdev (static address addr) then rdma-netns with the
// given extra settings. Options change it as an operator's NAD would.
func nad(t *testing.T, ns, name, netdev, addr, rdmaExtra string, opts ...nadOption) {
	t.Helper()
	var spec nadSpec
	for _, o := range opts {
		o(&spec)
	}
	device := fmt.Sprintf(`"device": %q, `, netdev)
	if netdev == "" {
		device = "" // the NIC comes from the device plugin's allocation (pciBusID)
	}
	if spec.podPicks {
		device = `"capabilities": {"deviceID": true}, `
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [
  {"type": "host-device", %s"ipam": {"type": "static", "addresses": [{"address": %q}]}},
  {"type": "rdma-netns"%s}]}`, name, device, addr, rdmaExtra)
	var annotations string
	if spec.resource != "" {
		annotations = fmt.Sprintf("  annotations:\n    k8s.v1.cni.cncf.io/resourceName: %s\n", spec.resource)
	}
	manifest := fmt.Sprintf(`apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: %s
  namespace: %s
%sspec:
  config: %q
`, name, ns, annotations, conf)
	if err := apply(ctx(t), []byte(manifest)); err != nil {
		t.Fatalf("NAD %s: %v", name, err)
	}
}

// nadSpec is what nadOptions change in a NAD.
type nadSpec struct {
	resource string
	podPicks bool
}

type nadOption func(*nadSpec)

// byResource makes the NAD's NIC the one a device plugin allocates the pod
// from resource (its resourceName annotation): Multus hands its PCI
// address to every plugin of the chain as deviceID and pciBusID.
func byResource(resource string) nadOption {
	return func(s *nadSpec) { s.resource = resource }
}

// byPodDeviceID makes host-device take the NIC the pod's network-selection
// deviceID names (it declares the deviceID capability, and names no NIC
// of its own), as conf/nad-device-info.yaml does.
func byPodDeviceID(s *nadSpec) { s.podPicks = true }

// toolsPod is an unprivileged pod of the tools image in namespace ns, its
// k8s.v1.cni.cncf.io/networks annotation network (a NAD's name, or the
// JSON form of network-selection elements).
func toolsPod(ns, name, network string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": network}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{unprivilegedTools("tools", "3600")},
		},
	}
}

// unprivilegedTools is a container of the tools image that sleeps for
// sleep (sleep(1)'s argument), with no privilege escalation and every
// capability dropped, as a plain pod spec runs a workload.
func unprivilegedTools(name, sleep string) corev1.Container {
	return corev1.Container{
		Name: name, Image: cririg.ToolsImage, ImagePullPolicy: corev1.PullNever,
		Command: []string{"sleep", sleep},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: new(bool),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
}

// waitEvent waits for a pod event whose message contains every one of
// want, and returns it.
func waitEvent(t *testing.T, ns, name string, want ...string) string {
	t.Helper()
	var msg string
	err := cririg.Wait(2*time.Minute, "an event of "+ns+"/"+name+" saying "+strings.Join(want, ", "), func() (bool, error) {
		list, err := cs.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
	next:
		for _, e := range list.Items {
			for _, w := range want {
				if !strings.Contains(e.Message, w) {
					continue next
				}
			}
			msg = e.Message
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, events(t, ns, name))
	}
	return msg
}

// hostState is the host's netdevs and RDMA devices, without the host ends
// of the cluster network's veths (ptp's veth*), which rdma-netns never
// makes: a failed sandbox's netns, with its veth, outlives the sandbox
// until Multus's daemon closes the file it opened on it (its
// validateIfName never closes it; Go's finalizer does, at a garbage
// collection, forced every two minutes in an idle daemon).
func hostState(t *testing.T) (netdevs, rdma []string) {
	t.Helper()
	all, err := rig.NetdevsIn("")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range all {
		if !strings.HasPrefix(n, "veth") {
			netdevs = append(netdevs, n)
		}
	}
	if rdma, err = rig.RDMAIn(""); err != nil {
		t.Fatal(err)
	}
	return netdevs, rdma
}

// waitHostState waits until the host's netdevs and RDMA devices are as
// given (a failed ADD's rollback runs after kubelet reports it).
func waitHostState(t *testing.T, netdevs, rdma []string) {
	t.Helper()
	err := cririg.Wait(time.Minute, "the host's devices unchanged", func() (bool, error) {
		n, r := hostState(t)
		return strings.Join(n, " ") == strings.Join(netdevs, " ") && strings.Join(r, " ") == strings.Join(rdma, " "), nil
	})
	if err != nil {
		n, r := hostState(t)
		t.Fatalf("%v: netdevs %v (want %v), RDMA %v (want %v)", err, n, netdevs, r, rdma)
	}
}

// Bad input through the API: the pod stays ContainerCreating, its events
// say what failed, and nothing on the node changes.
func TestBadInput(t *testing.T) {
	netdevs, rdma := hostState(t)

	t.Run("missing NIC", func(t *testing.T) {
		nad(t, "default", "missing-nic", "eth99", "10.100.101.1/29", "")
		createPod(t, toolsPod("default", "missing-nic", "missing-nic"))
		// host-device's own message; it does not name the device.
		msg := waitEvent(t, "default", "missing-nic", `plugin type="host-device" failed (add)`, "failed to find host device")
		t.Logf("event: %s", msg)
		if p, err := cs.CoreV1().Pods("default").Get(ctx(t), "missing-nic", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod: %v %v, want Pending", p.Status.Phase, err)
		}
		deletePod(t, "default", "missing-nic", metav1.DeleteOptions{})
		waitHostState(t, netdevs, rdma)
	})

	t.Run("device held by another pod", func(t *testing.T) {
		held := rdmaOf(t, "eth2")
		nad(t, "default", "holder", "eth2", "10.100.102.1/29", "")
		nad(t, "default", "thief", "eth3", "10.100.103.1/29", fmt.Sprintf(`, "rdmaDevice": %q`, held))
		createPod(t, toolsPod("default", "holder", "holder"))
		waitRunning(t, "default", "holder", 3*time.Minute)
		_, heldRDMA := hostState(t)
		heldNetdevs, _ := hostState(t)
		createPod(t, toolsPod("default", "thief", "thief"))
		msg := waitEvent(t, "default", "thief", held, "held by pod default/holder", "nothing was changed", "Delete the pod that holds it")
		t.Logf("event: %s", msg)
		if p, err := cs.CoreV1().Pods("default").Get(ctx(t), "thief", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod: %v %v, want Pending", p.Status.Phase, err)
		}
		// eth3 came back with the failed ADD's DEL; the holder keeps its device.
		waitHostState(t, heldNetdevs, heldRDMA)
		in, err := rig.RDMAIn(mustNetns(t, "default", "holder"))
		if err != nil || len(in) != 1 || in[0] != held {
			t.Errorf("holder's RDMA devices %v (%v), want [%s]", in, err, held)
		}
		deletePod(t, "default", "thief", metav1.DeleteOptions{})
		deletePod(t, "default", "holder", metav1.DeleteOptions{})
		waitHostState(t, netdevs, rdma)
	})
}

func mustNetns(t *testing.T, ns, name string) string {
	t.Helper()
	netns, err := ctd.PodNetns(ctx(t), sandboxOf(t, ns, name).Id)
	if err != nil {
		t.Fatal(err)
	}
	return netns
}
