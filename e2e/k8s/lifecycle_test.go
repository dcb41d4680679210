//go:build e2e

package k8s

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// runClassPod runs an unprivileged tools pod of the RuntimeClass handler,
// changed by each of edit, and returns its netns once it is Running with
// the handler's device.
func runClassPod(t *testing.T, name, handler string, edit ...func(*corev1.Pod)) (netns, dev string) {
	t.Helper()
	n, err := cririg.NetworkOf(handler)
	if err != nil {
		t.Fatal(err)
	}
	applyRuntimeClasses(t)
	pod := toolsPod("default", name, "")
	delete(pod.Annotations, "k8s.v1.cni.cncf.io/networks")
	pod.Spec.RuntimeClassName = &handler
	for _, e := range edit {
		e(pod)
	}
	createPod(t, pod)
	waitRunning(t, "default", name, 3*time.Minute)
	netns = mustNetns(t, "default", name)
	if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != n.RDMA {
		t.Fatalf("pod %s: RDMA devices %v (%v), want [%s]", name, in, err, n.RDMA)
	}
	return netns, n.RDMA
}

// sandboxesOf counts the CRI sandboxes (any state) of a pod of "default"
// by its name, those of pods of that name deleted before included.
func sandboxesOf(t *testing.T, name string) int {
	t.Helper()
	return sandboxesLabelled(t, map[string]string{"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.name": name})
}

// sandboxesLabelled counts the CRI sandboxes (any state) with the
// kubelet's labels given: io.kubernetes.pod.uid for one pod object alone.
func sandboxesLabelled(t *testing.T, labels map[string]string) int {
	t.Helper()
	return sandboxesIn(t, labels, nil)
}

// sandboxesIn counts the sandboxes with labels in state (nil: any).
func sandboxesIn(t *testing.T, labels map[string]string, state *runtimeapi.PodSandboxStateValue) int {
	t.Helper()
	resp, err := ctd.Runtime.ListPodSandbox(ctx(t), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{LabelSelector: labels, State: state}})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Items)
}

// A forced delete (kubectl delete --grace-period=0 --force) removes the
// pod from the API at once; kubelet then tears the sandbox down, the
// device comes back with no record left, and kubelet's garbage collection
// removes the dead sandbox.
func TestForcedDelete(t *testing.T) {
	_, dev := runClassPod(t, "forced", "rdma-eth2")
	zero := int64(0)
	deletePod(t, "default", "forced", metav1.DeleteOptions{GracePeriodSeconds: &zero})
	waitHome(t, dev)
	var recs []string
	if err := cririg.Wait(30*time.Second, "no record left once the device is home", func() (bool, error) {
		recs = rig.Records(cririg.RecordsDir)
		return len(recs) == 0, nil
	}); err != nil {
		t.Errorf("%v: %v", err, recs)
	}
	// kubelet's garbage collection removes the dead sandbox within minutes
	// (its container GC runs once a minute). That wait is spent on the
	// other tests: the rest of this one runs after them (no other test
	// makes a pod of this name).
	t.Parallel()
	if err := cririg.Wait(3*time.Minute, "the sandbox of default/forced removed", func() (bool, error) {
		return sandboxesOf(t, "forced") == 0, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// kubelet restarted with a pod running changes nothing (survivesRestart).
func TestKubeletRestart(t *testing.T) {
	survivesRestart(t, "survivor", "kubelet", func() error {
		if d, err := cluster.CPUTime(kubelet.Pid()); err == nil {
			stoppedKubeletCPU += d
		}
		kubelet.Stop()
		var err error
		if kubelet, err = node.StartKubelet(); err != nil {
			return err
		}
		return waitNode(4*time.Minute, true)
	})
}

// containerd killed and started again with a pod running changes nothing
// (survivesRestart), and the pod's device comes back through the new
// containerd.
func TestContainerdRestart(t *testing.T) {
	survivesRestart(t, "ctd-survivor", "containerd", func() error {
		if d, err := cluster.CPUTime(ctd.Pid()); err == nil {
			stoppedContainerdCPU += d
		}
		restarted, err := ctd.Restart()
		if err != nil {
			return err
		}
		ctd = restarted
		return nil
	})
}

// survivesRestart runs a pod called name, restarts what (kubelet or
// containerd) with restart, and checks that nothing changed for the pod:
// kubelet keeps it Running with its sandbox, the device stays in its
// netns, and no CNI ADD or DEL runs for it. Deleting it afterwards returns
// the device.
func survivesRestart(t *testing.T, name, what string, restart func() error) {
	t.Helper()
	netns, dev := runClassPod(t, name, "rdma-eth2")
	sb := sandboxOf(t, "default", name).Id
	before, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}
	if err := restart(); err != nil {
		t.Fatalf("restart %s: %v", what, err)
	}
	// Give kubelet a few sync rounds over the pod after the restart.
	time.Sleep(20 * time.Second)
	if err := waitNode(4*time.Minute, true); err != nil {
		t.Fatal(err)
	}
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod after %s's restart: %s", what, p.Status.Phase)
	}
	kept(t, name, what+"'s restart", sb, netns, dev)
	calls, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls[len(before):] {
		if c.ContainerID == sb && c.Command != "STATUS" {
			t.Errorf("%s's restart made containerd call %s %s for the running pod", what, c.Plugin, c.Command)
		}
	}
	deletePod(t, "default", name, metav1.DeleteOptions{})
	waitHome(t, dev)
}

// kept checks that the pod called name kept its sandbox sb across what,
// and its netns its one RDMA device dev.
func kept(t *testing.T, name, what, sb, netns, dev string) {
	t.Helper()
	if got := sandboxOf(t, "default", name).Id; got != sb {
		t.Errorf("pod's sandbox changed across %s: %s, was %s", what, got, sb)
	}
	if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != dev {
		t.Errorf("pod's RDMA devices after %s: %v (%v), want [%s]", what, in, err, dev)
	}
}

// uverbsOf is the uverbs node (uverbsN) of an RDMA device, read from the
// host's sysfs while the device is there.
func uverbsOf(t *testing.T, dev string) string {
	t.Helper()
	dirs, _ := filepath.Glob("/sys/class/infiniband_verbs/uverbs*")
	for _, d := range dirs {
		if ibdev, err := os.ReadFile(filepath.Join(d, "ibdev")); err == nil && strings.TrimSpace(string(ibdev)) == dev {
			return filepath.Base(d)
		}
	}
	t.Fatalf("no uverbs node of %s in the host's sysfs (%d nodes)", dev, len(dirs))
	return ""
}

// A container that exits non-zero is restarted in place by kubelet
// (restartPolicy Always): same sandbox, so no CNI call, and the pod's netns
// keeps its device; the new container gets from the NRI plugin, again, its
// device's uverbs node and rdma_cm in /dev/infiniband and memlock
// unlimited. The container's first start leaves a marker in an emptyDir
// and exits 1; its second start finds it and stays up.
func TestCrashRestart(t *testing.T) {
	n, err := cririg.NetworkOf("rdma-eth2")
	if err != nil {
		t.Fatal(err)
	}
	uverbs := uverbsOf(t, n.RDMA)
	started := time.Now()
	netns, dev := runClassPod(t, "crasher", "rdma-eth2", func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		c := &p.Spec.Containers[0]
		c.VolumeMounts = []corev1.VolumeMount{{Name: "state", MountPath: "/state"}}
		c.Command = []string{"sh", "-c", "if [ -e /state/crashed ]; then exec sleep 3600; fi; touch /state/crashed; exit 1"}
	})
	sb := sandboxOf(t, "default", "crasher").Id
	var last corev1.ContainerStatus
	err = cririg.Wait(3*time.Minute, "container of default/crasher restarted and running", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx(t), "crasher", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			return false, err
		}
		last = p.Status.ContainerStatuses[0]
		return last.RestartCount >= 1 && last.State.Running != nil, nil
	})
	if err != nil {
		t.Fatalf("%v\nlast status: %+v\nevents:\n%s", err, last, events(t, "default", "crasher"))
	}
	t.Logf("container restarted (restartCount %d) and running %s after create", last.RestartCount, time.Since(started).Round(time.Millisecond))
	kept(t, "crasher", "the container's restart", sb, netns, dev)
	if rig.HostHas(t, dev) {
		t.Errorf("%s is in the host netns with the pod running", dev)
	}
	out, stderr, err := execIn(t, "default", "crasher", "tools", "sh", "-c", "ls /dev/infiniband; ulimit -l")
	f := strings.Fields(out)
	if err != nil || len(f) == 0 || f[len(f)-1] != "unlimited" {
		t.Errorf("ulimit -l in the restarted container: %q (%v) %s, want unlimited", out, err, stderr)
	}
	if !rig.Contains(f, uverbs) || !rig.Contains(f, "rdma_cm") {
		t.Errorf("/dev/infiniband in the restarted container: %q, want %s (of %s) and rdma_cm", out, uverbs, dev)
	}
	deletePod(t, "default", "crasher", metav1.DeleteOptions{})
	waitHome(t, dev)
}

// classDeployment makes a Deployment of unprivileged tools pods of the
// RuntimeClass handler, at 0 replicas, changed by each of edit.
func classDeployment(t *testing.T, name, handler string, edit ...func(*corev1.Pod)) {
	t.Helper()
	pod := toolsPod("default", "", "")
	delete(pod.Annotations, "k8s.v1.cni.cncf.io/networks")
	pod.Spec.RuntimeClassName = &handler
	for _, e := range edit {
		e(pod)
	}
	labels := map[string]string{"app": name}
	zero := int32(0)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx(t), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("deployment %s: %v", name, err)
	}
}

// scale sets a Deployment's replicas through its scale subresource, as
// `kubectl scale` does.
func scale(t *testing.T, name string, replicas int32) {
	t.Helper()
	// The Deployment controller writes the object too (its status, right
	// after create): read and write again on a conflict, as kubectl does.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := cs.AppsV1().Deployments("default").GetScale(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Replicas = replicas
		_, err = cs.AppsV1().Deployments("default").UpdateScale(ctx(t), name, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("scale %s to %d: %v", name, replicas, err)
	}
}

// podsOf lists the pods of a Deployment.
func podsOf(t *testing.T, name string) []corev1.Pod {
	t.Helper()
	list, err := cs.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// Deployments scaled 0 -> 2 pods -> 0 across two NICs: a Deployment's
// pods share one template, and with no device plugin to hand each replica
// its own NIC, the two NICs are two Deployments, one per RuntimeClass
// (rdma-eth1, rdma-eth2), scaled together from 0 to 1 and back. At 2 pods
// both are Running, each pod's netns holds its NIC's RDMA device alone and
// the host holds neither; at 0 both devices are back on the host and no
// attachment record is left.
func TestDeploymentScale(t *testing.T) {
	applyRuntimeClasses(t)
	want := map[string]string{} // Deployment -> RDMA device
	for _, handler := range []string{"rdma-eth1", "rdma-eth2"} {
		n, err := cririg.NetworkOf(handler)
		if err != nil {
			t.Fatal(err)
		}
		name := "scale-" + handler
		want[name] = n.RDMA
		classDeployment(t, name, handler)
		defer cs.AppsV1().Deployments("default").Delete(ctx(t), name, metav1.DeleteOptions{})
	}
	if want["scale-rdma-eth1"] == want["scale-rdma-eth2"] {
		t.Fatalf("rdma-eth1 and rdma-eth2 have the same RDMA device %s", want["scale-rdma-eth1"])
	}

	started := time.Now()
	for name := range want {
		scale(t, name, 1)
	}
	for name, dev := range want {
		var pods []corev1.Pod
		err := cririg.Wait(3*time.Minute, "one Running pod of "+name, func() (bool, error) {
			pods = podsOf(t, name)
			return len(pods) == 1 && pods[0].Status.Phase == corev1.PodRunning, nil
		})
		if err != nil {
			t.Fatalf("%v\npods: %d\nkubelet log:\n%s", err, len(pods), kubelet.LogTail(30))
		}
		netns := mustNetns(t, "default", pods[0].Name)
		if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != dev {
			t.Errorf("pod %s: RDMA devices %v (%v), want [%s]", pods[0].Name, in, err, dev)
		}
		if rig.HostHas(t, dev) {
			t.Errorf("%s is in the host netns with pod %s running", dev, pods[0].Name)
		}
	}
	t.Logf("scaled 0 -> 2 pods: both Running with their devices %s after the scale", time.Since(started).Round(time.Millisecond))

	started = time.Now()
	for name := range want {
		scale(t, name, 0)
	}
	for name, dev := range want {
		if err := cririg.Wait(2*time.Minute, "the pods of "+name+" gone", func() (bool, error) {
			return len(podsOf(t, name)) == 0, nil
		}); err != nil {
			t.Fatal(err)
		}
		waitHome(t, dev)
	}
	t.Logf("scaled 2 -> 0 pods: both gone and both devices on the host %s after the scale", time.Since(started).Round(time.Millisecond))
	if err := cririg.Wait(time.Minute, "no attachment record left", func() (bool, error) {
		return len(rig.Records(cririg.RecordsDir)) == 0, nil
	}); err != nil {
		t.Errorf("%v: %s", err, recordFiles(t))
	}
}
