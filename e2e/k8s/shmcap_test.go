//go:build e2e

package k8s

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
)

// A pod holding an RDMA device whose rdma-netns.io/shm-size asks for more
// than the node allows (the chart's nri.maxShmSize, 16Gi) gets no
// container: its events say what it asked, the cap and what to do, and
// deleting it returns its device.
func TestShmAboveTheCap(t *testing.T) {
	const name, handler = "shm-greedy", "rdma-eth1"
	n, err := cririg.NetworkOf(handler)
	if err != nil {
		t.Fatal(err)
	}
	applyRuntimeClasses(t)
	pod := toolsPod("default", name, "")
	delete(pod.Annotations, "k8s.v1.cni.cncf.io/networks")
	pod.Annotations["rdma-netns.io/shm-size"] = "32Gi"
	class := handler
	pod.Spec.RuntimeClassName = &class
	createPod(t, pod)
	msg := waitEvent(t, "default", name, "rdma-netns.io/shm-size: 32Gi", "--max-shm-size 16Gi", "nri.maxShmSize")
	t.Logf("event: %s", msg)
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("pod %s: %s, want Pending", name, p.Status.Phase)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running != nil {
			t.Errorf("pod %s: container %s runs", name, c.Name)
		}
	}
	deletePod(t, "default", name, metav1.DeleteOptions{})
	waitHome(t, n.RDMA)
}
