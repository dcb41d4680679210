//go:build e2e

package k8s

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// A node without RDMA hardware (make e2e-k8s boots one with vm-run.sh
// --no-rxe). The DaemonSet runs only on nodes with the RDMA label, and
// this node carries it (node.RDMALabelKey) as an operator who labels a
// node by mistake would: the DaemonSet runs there without an error or a
// restart, and a pod on a plain network (Multus's default, ptp) is
// untouched: no RDMA device, no /dev/infiniband, the runtime's memlock,
// its 64 MiB /dev/shm and nothing from the NRI plugin. Without the label
// the DaemonSet's pod leaves the node and none is wanted there.
func TestNoRDMA(t *testing.T) {
	if devs, err := rig.RDMAIn(""); err != nil || len(devs) != 0 || vmConf("VM_RXE") != "0" {
		t.Skipf("the node has RDMA devices %v (%v): not a node without RDMA hardware (vm-run.sh --no-rxe)", devs, err)
	}
	// The exporter answers a scrape with nothing to report, and says
	// nothing wrong about it in its log.
	scrape(t)

	pods, err := cs.CoreV1().Pods(dsNamespace).List(ctx(t), metav1.ListOptions{LabelSelector: dsSelector})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the DaemonSet's pods: %d (%v), want 1", len(pods.Items), err)
	}
	ds := pods.Items[0]
	for _, c := range append(ds.Status.InitContainerStatuses, ds.Status.ContainerStatuses...) {
		if c.RestartCount != 0 {
			t.Errorf("DaemonSet pod %s: container %s restarted %d times (last state %+v)", ds.Name, c.Name, c.RestartCount, c.LastTerminationState)
		}
		if c.Name != "install" && !c.Ready {
			t.Errorf("DaemonSet pod %s: container %s not Ready: %+v", ds.Name, c.Name, c.State)
		}
		logs := podLogs(t, ds, c.Name)
		t.Logf("container %s's log:\n%s", c.Name, logs)
		if l := errorLines(logs); l != "" {
			t.Errorf("DaemonSet pod %s: container %s logged errors:\n%s", ds.Name, c.Name, l)
		}
	}

	pod := toolsPod("default", "plain", "")
	delete(pod.Annotations, "k8s.v1.cni.cncf.io/networks")
	createPod(t, pod)
	defer deletePod(t, "default", "plain", metav1.DeleteOptions{})
	waitRunning(t, "default", "plain", 3*time.Minute)
	if in, err := rig.RDMAIn(mustNetns(t, "default", "plain")); err != nil || len(in) != 0 {
		t.Errorf("plain pod's netns: RDMA devices %v (%v), want none", in, err)
	}
	out, stderr, err := execIn(t, "default", "plain", "tools", "sh", "-c",
		"ls /dev/infiniband 2>/dev/null | wc -l; ulimit -l; df -k /dev/shm | tail -n1")
	if err != nil {
		t.Fatalf("exec in the plain pod: %v %s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("exec in the plain pod: %q", out)
	}
	if lines[0] != "0" {
		t.Errorf("plain pod: /dev/infiniband has %s entries, want none", lines[0])
	}
	if want := ctd.MustMemlockKiB(t); lines[1] != want {
		t.Errorf("plain pod: ulimit -l %s, want the runtime's own %s", lines[1], want)
	}
	if f := strings.Fields(lines[2]); len(f) < 2 || f[1] != strconv.Itoa(64*1024) {
		t.Errorf("plain pod: /dev/shm %q, want the runtime's 64 MiB", lines[2])
	}
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if by := adjustedBy(t, *p); by != "" {
		t.Errorf("plain pod: %s = %q, want none: the NRI plugin changed a pod without RDMA devices", nriAdjustedBy, by)
	}

	labelNode(t, nil)
	t.Cleanup(func() { labelNode(t, new(node.RDMALabelValue)) })
	err = cririg.Wait(2*time.Minute, "no DaemonSet pod on the node without the RDMA label, none wanted", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(dsNamespace).List(ctx(t), metav1.ListOptions{LabelSelector: dsSelector})
		if err != nil {
			return false, err
		}
		ds, err := cs.AppsV1().DaemonSets(dsNamespace).Get(ctx(t), dsName, metav1.GetOptions{})
		return err == nil && len(pods.Items) == 0 && ds.Status.DesiredNumberScheduled == 0, err
	})
	if err != nil {
		t.Error(err)
	}
}

// labelNode sets the node's RDMA label to value, or removes it (nil), as
// `kubectl label node` does.
func labelNode(t *testing.T, value *string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{node.RDMALabelKey: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx(t), node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("label node %s: %v", node.Name, err)
	}
}

// podLogs is a container's log, as `kubectl logs` gets it.
func podLogs(t *testing.T, p corev1.Pod, container string) string {
	t.Helper()
	data, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx(t))
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", p.Name, container, err)
	}
	return string(data)
}

var errorLine = regexp.MustCompile(`(?i)\b(error|fatal|panic)\b`)

func errorLines(logs string) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if errorLine.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// vmConf is a setting of /etc/vm.conf (vm-run.sh, scripts/README.md).
func vmConf(key string) string {
	data, _ := os.ReadFile("/etc/vm.conf")
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
