//go:build e2e

package k8s

import (
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// The node registered itself with the versions the README names.
func TestNodeVersions(t *testing.T) {
	n, err := cs.CoreV1().Nodes().Get(ctx(t), node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := n.Status.NodeInfo
	t.Logf("kubelet %s, runtime %s, kernel %s", info.KubeletVersion, info.ContainerRuntimeVersion, info.KernelVersion)
	if info.KubeletVersion != "v1.34.2" {
		t.Errorf("kubelet version %q, want v1.34.2", info.KubeletVersion)
	}
	// containerd built from its module says 2.2.1+unknown (no git stamp).
	rt, _, _ := strings.Cut(strings.TrimPrefix(info.ContainerRuntimeVersion, "containerd://"), "+")
	if strings.TrimPrefix(rt, "v") != "2.2.1" {
		t.Errorf("runtime version %q, want containerd 2.2.1", info.ContainerRuntimeVersion)
	}
}

// conf/containerd/runtimeclasses.yaml applied to the API server, a pod of
// the RuntimeClass rdma-eth1 made by kubelet: containerd runs the handler's
// chain (host-device eth1, rdma-netns), the pod's netns holds eth1's RDMA
// device and the host does not; `kubectl exec` (through the API server and
// kubelet) shows the container, unprivileged with every capability dropped,
// that device alone, with the NRI plugin's memlock; `kubectl delete pod`
// returns it.
func TestRuntimeClassPod(t *testing.T) {
	applyRuntimeClasses(t)
	n, err := cririg.NetworkOf("rdma-eth1")
	if err != nil {
		t.Fatal(err)
	}
	class := "rdma-eth1"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "rc-eth1", Namespace: "default"},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &class,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "tools", Image: cririg.ToolsImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: new(bool),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	createPod(t, pod)
	took := waitRunning(t, pod.Namespace, pod.Name, 3*time.Minute)
	t.Logf("pod Running %s after create", took.Round(time.Millisecond))
	sb := sandboxOf(t, pod.Namespace, pod.Name)
	netns, err := ctd.PodNetns(ctx(t), sb.Id)
	if err != nil {
		t.Fatal(err)
	}
	in, err := rig.RDMAIn(netns)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 1 || in[0] != n.RDMA {
		t.Errorf("pod's netns has RDMA devices %v, want [%s]", in, n.RDMA)
	}
	if rig.HostHas(t, n.RDMA) {
		t.Errorf("%s is still in the host netns with the pod running", n.RDMA)
	}
	out, stderr, err := execIn(t, pod.Namespace, pod.Name, "tools", "ibv_devices")
	if err != nil {
		t.Errorf("exec ibv_devices: %v\n%s", err, stderr)
	} else if devs := verbsDevices(out); len(devs) != 1 || devs[0] != n.RDMA {
		t.Errorf("ibv_devices in the pod lists %v, want [%s]:\n%s", devs, n.RDMA, out)
	}
	out, stderr, err = execIn(t, pod.Namespace, pod.Name, "tools", "sh", "-c", "ulimit -l")
	if err != nil || strings.TrimSpace(out) != "unlimited" {
		t.Errorf("ulimit -l in the pod: %q (%v) %s, want unlimited", out, err, stderr)
	}
	deletePod(t, pod.Namespace, pod.Name, metav1.DeleteOptions{})
	waitHome(t, n.RDMA)
}

// verbsDevices parses ibv_devices' table: a header, a dashed line, then
// one "name guid" line per device.
func verbsDevices(out string) []string {
	var devs []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] != "device" && !strings.HasPrefix(f[0], "-") {
			devs = append(devs, f[0])
		}
	}
	return devs
}

// applyRuntimeClasses applies conf/containerd/runtimeclasses.yaml.
func applyRuntimeClasses(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile("/payload/containerd/runtimeclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(ctx(t), data); err != nil {
		t.Fatalf("apply conf/containerd/runtimeclasses.yaml: %v", err)
	}
}
