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
// device and the host does not; `kubectl delete pod` returns it.
func TestRuntimeClassPod(t *testing.T) {
	data, err := os.ReadFile("/payload/containerd/runtimeclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(ctx(t), data); err != nil {
		t.Fatalf("apply conf/containerd/runtimeclasses.yaml: %v", err)
	}
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
	if hostHas(t, n.RDMA) {
		t.Errorf("%s is still in the host netns with the pod running", n.RDMA)
	}
	deletePod(t, pod.Namespace, pod.Name, metav1.DeleteOptions{})
	waitHome(t, n.RDMA)
}
