//go:build e2e

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// The node rebooted. make e2e-k8s boots the VM twice on one disk
// (vm-run.sh --disk) while the control plane on the host keeps its state.
// The disk keeps what a node keeps (/var/lib/kubelet, /var/lib/containerd,
// /var/lib/cni, /var/log, /opt/cni/bin, /opt/nri, /etc/cni, /etc/nri); /run
// and every network namespace start empty, and ib_core's module parameter
// makes the RDMA netns mode exclusive again when it loads.
//
// The file's name sorts last on purpose: go test runs a package's tests
// in the order of its files, and the first boot's part must come after
// every other test, since it leaves pods holding eth1's and eth2's devices.
//
// The first boot ends with two Deployments (RuntimeClasses rdma-eth1 and
// rdma-eth2) whose pods hold their NICs' RDMA devices, and the VM ends
// (the disk synced, then a reset) with them running: no pod stopped, no
// CNI DEL. On the second boot containerd starts the NRI plugin the
// DaemonSet pre-installed before it serves CRI, kubelet starts, and the
// pods come back by themselves.

// rebootNotes is what the first boot tells the second, on the disk itself
// (vm-run.sh mounts it at /mnt/disk).
const rebootNotes = "/mnt/disk/e2e-reboot.json"

// rebootPod is a Deployment's pod as the first boot left it.
type rebootPod struct {
	Deployment, Pod, UID, Device, Sandbox string
	RestartCount                          int32
}

// rebootCheck is the containers' command: a container started without the
// NRI plugin's device nodes or memlock exits 1 at once, so kubelet restarts
// it and the restart count says so.
const rebootCheck = `if [ -e /dev/infiniband/rdma_cm ] && [ "$(ulimit -l)" = unlimited ]; then echo "started with /dev/infiniband and memlock unlimited"; exec sleep 36000; fi
echo "started without /dev/infiniband/rdma_cm or memlock unlimited"; exit 1`

func TestReboot(t *testing.T) {
	if *boot == bootReboot {
		afterReboot(t)
		return
	}
	if _, err := os.Stat(filepath.Dir(rebootNotes)); err != nil {
		t.Skip("the node has no disk (vm-run.sh --disk): no reboot follows")
	}
	beforeReboot(t)
}

// beforeReboot runs the Deployments' pods and notes them for the next boot.
func beforeReboot(t *testing.T) {
	applyRuntimeClasses(t)
	var notes []rebootPod
	for _, handler := range []string{"rdma-eth1", "rdma-eth2"} {
		n, err := cririg.NetworkOf(handler)
		if err != nil {
			t.Fatal(err)
		}
		name := "reboot-" + handler
		classDeployment(t, name, handler, func(p *corev1.Pod) {
			p.Spec.Containers[0].Command = []string{"sh", "-c", rebootCheck}
		})
		scale(t, name, 1)
		notes = append(notes, rebootPod{Deployment: name, Device: n.RDMA})
	}
	for i, n := range notes {
		p := waitDeploymentPod(t, n.Deployment, time.Time{})
		netns := mustNetns(t, "default", p.Name)
		if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != n.Device {
			t.Fatalf("pod %s: RDMA devices %v (%v), want [%s]", p.Name, in, err, n.Device)
		}
		notes[i].Pod, notes[i].UID = p.Name, string(p.UID)
		notes[i].Sandbox = sandboxOf(t, "default", p.Name).Id
		notes[i].RestartCount = p.Status.ContainerStatuses[0].RestartCount
	}
	draBeforeReboot(t)
	data, err := json.Marshal(notes)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rebootNotes, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("powering off with %+v", notes)
}

// waitDeploymentPod waits for the one pod of a Deployment to be Ready with
// its container started after since, and returns it.
func waitDeploymentPod(t *testing.T, name string, since time.Time) corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := cririg.Wait(4*time.Minute, "one Ready pod of "+name, func() (bool, error) {
		pods = podsOf(t, name)
		if len(pods) != 1 || len(pods[0].Status.ContainerStatuses) != 1 {
			return false, nil
		}
		c := pods[0].Status.ContainerStatuses[0]
		return c.Ready && c.State.Running != nil && c.State.Running.StartedAt.After(since), nil
	})
	if err != nil {
		msg := fmt.Sprintf("%d pods", len(pods))
		if len(pods) == 1 {
			msg = fmt.Sprintf("%+v\nevents:\n%s", pods[0].Status, events(t, "default", pods[0].Name))
		}
		t.Fatalf("%v\n%s\nkubelet log:\n%s", err, msg, kubelet.LogTail(30))
	}
	return pods[0]
}

// afterReboot checks the second boot: the same pods (kubelet brought them
// back, nothing replaced them), each container started once since the
// reboot and had its device, device nodes, memlock and /dev/shm from that
// first start on; no record from before the reboot is left, every device
// no pod holds is on the host, and the doctor finds nothing to fix.
func afterReboot(t *testing.T) {
	data, err := os.ReadFile(rebootNotes)
	if os.IsNotExist(err) {
		t.Skip("the first boot did not run TestReboot (E2E_FLAGS narrowed it?): nothing to check")
	}
	if err != nil {
		t.Fatal(err)
	}
	var notes []rebootPod
	if err := json.Unmarshal(data, &notes); err != nil {
		t.Fatalf("%s: %v", rebootNotes, err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("containerd's log on NRI since its start:\n%s", nriLog(t))
		}
	}()
	held := map[string]bool{}
	for _, n := range notes {
		p := waitDeploymentPod(t, n.Deployment, kubelet.Started)
		c := p.Status.ContainerStatuses[0]
		t.Logf("pod %s Running again, its container started %s after kubelet (restartCount %d, was %d)",
			p.Name, c.State.Running.StartedAt.Sub(kubelet.Started).Round(time.Second), c.RestartCount, n.RestartCount)
		if p.Name != n.Pod || string(p.UID) != n.UID {
			t.Errorf("Deployment %s: pod %s (%s) after the reboot, was %s (%s): kubelet did not bring the pod back", n.Deployment, p.Name, p.UID, n.Pod, n.UID)
		}
		// kubelet counts the container the power-off ended as the previous
		// start: one start since, unless the first one failed its check.
		if c.RestartCount != n.RestartCount+1 {
			t.Errorf("pod %s: restartCount %d, was %d before the reboot: its container did not come up with its device nodes and memlock at its first start (last state %+v)",
				p.Name, c.RestartCount, n.RestartCount, c.LastTerminationState)
		}
		sb := sandboxOf(t, "default", p.Name).Id
		if sb == n.Sandbox {
			t.Errorf("pod %s: sandbox %s is the one from before the reboot", p.Name, sb)
		}
		netns := mustNetns(t, "default", p.Name)
		if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != n.Device {
			t.Errorf("pod %s: RDMA devices %v (%v) after the reboot, want [%s]", p.Name, in, err, n.Device)
		}
		if rig.HostHas(t, n.Device) {
			t.Errorf("%s is in the host netns with pod %s running", n.Device, p.Name)
		}
		held[n.Device] = true
		checkRDMAContainer(t, p, n.Device)
	}
	draDevs := draAfterReboot(t)
	for _, dev := range draDevs {
		held[dev] = true
	}
	extra := map[string][]string{}
	if len(draDevs) > 0 {
		p := waitDeploymentPod(t, rebootDRADeployment, kubelet.Started)
		extra[sandboxOf(t, "default", p.Name).Id] = draDevs
	}
	checkRecords(t, notes, extra)
	for _, dev := range layoutDevices(t) {
		if !held[dev] && !rig.HostHas(t, dev) {
			t.Errorf("%s is held by no pod and is not in the host netns", dev)
		}
	}
	if text, _, err := doctorrun.Text(cririg.CNIBinDir + "/rdma-netns"); err == nil {
		t.Logf("rdma-netns doctor after the reboot:\n%s", text)
	}
	report, code, err := doctorrun.JSON(cririg.CNIBinDir + "/rdma-netns")
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Errorf("rdma-netns doctor on the rebooted node: exit status %d, want 0", code)
	}
	for _, f := range report.Findings {
		if f.Severity != doctor.OK {
			t.Errorf("rdma-netns doctor on the rebooted node: %s %s %s: %s", f.Severity, f.Check, f.Subject, f.Reason)
		}
	}

	// The pods' devices return through the records made after the reboot.
	draAfterRebootGone(t, draDevs)
	for _, n := range notes {
		scale(t, n.Deployment, 0)
	}
	for _, n := range notes {
		if err := cririg.Wait(2*time.Minute, "the pods of "+n.Deployment+" gone", func() (bool, error) {
			return len(podsOf(t, n.Deployment)) == 0, nil
		}); err != nil {
			t.Fatal(err)
		}
		waitHome(t, n.Device)
	}
}

// checkRDMAContainer checks, from inside the pod's container, what the NRI
// plugin gives: the device's uverbs node and rdma_cm, memlock unlimited,
// the node's /dev/shm size (conf/daemonset.yaml: 1Gi, no memory limit
// here); and that the copy containerd launched adjusted it.
func checkRDMAContainer(t *testing.T, p corev1.Pod, dev string) {
	t.Helper()
	uverbs := uverbsOf(t, dev)
	out, stderr, err := execIn(t, "default", p.Name, "tools", "sh", "-c", "ls /dev/infiniband; ulimit -l; df -k /dev/shm | tail -n1")
	if err != nil {
		t.Errorf("pod %s: exec: %v %s", p.Name, err, stderr)
		return
	}
	f := strings.Fields(out)
	if !rig.Contains(f, uverbs) || !rig.Contains(f, "rdma_cm") {
		t.Errorf("pod %s: /dev/infiniband and limits %q, want %s (of %s) and rdma_cm", p.Name, out, uverbs, dev)
	}
	if !rig.Contains(f, "unlimited") {
		t.Errorf("pod %s: ulimit -l not unlimited: %q", p.Name, out)
	}
	if !strings.Contains(out, fmt.Sprintf(" %d ", 1024*1024)) {
		t.Errorf("pod %s: /dev/shm not the 1Gi the DaemonSet sets: %q", p.Name, out)
	}
	if by := adjustedBy(t, p); !strings.Contains(by, "launched by the runtime") {
		t.Errorf("pod %s: %s = %q, want the copy containerd launched at its start", p.Name, nriAdjustedBy, by)
	}
}

const nriAdjustedBy = "rdma-netns.io/nri-adjusted-by"

// adjustedBy is the NRI plugin's annotation in the OCI spec of the pod's
// (first) container, as containerd keeps it for the running task.
func adjustedBy(t *testing.T, p corev1.Pod) string {
	t.Helper()
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	data, err := os.ReadFile(filepath.Join("/run/containerd/io.containerd.runtime.v2.task", cririg.Namespace, id, "config.json"))
	if err != nil {
		t.Fatalf("pod %s: the container's OCI spec: %v", p.Name, err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("pod %s: the container's OCI spec: %v", p.Name, err)
	}
	return spec.Annotations[nriAdjustedBy]
}

// checkRecords waits until the records are those of the pods' sandboxes
// since the reboot, one each: every record from before the reboot is gone
// (kubelet stopped the dead sandboxes; CNI DEL without their netns).
func checkRecords(t *testing.T, notes []rebootPod, extra map[string][]string) {
	t.Helper()
	want := map[string][]string{} // sandbox -> devices
	for _, n := range notes {
		id := sandboxOf(t, "default", n.Pod).Id
		want[id] = append(want[id], n.Device)
	}
	for id, devs := range extra {
		want[id] = append(want[id], devs...)
	}
	for _, devs := range want {
		sort.Strings(devs)
	}
	var got map[string][]string
	err := cririg.Wait(2*time.Minute, "the records of the pods since the reboot, and no other", func() (bool, error) {
		got = map[string][]string{}
		for _, f := range rig.Records(cririg.RecordsDir) {
			var r struct {
				ContainerID string `json:"containerID"`
				Device      string `json:"rdmaDevice"`
			}
			data, err := os.ReadFile(filepath.Join(cririg.RecordsDir, f))
			if err != nil || json.Unmarshal(data, &r) != nil {
				got[f] = []string{"unreadable"}
				continue
			}
			got[r.ContainerID] = append(got[r.ContainerID], r.Device)
		}
		for _, devs := range got {
			sort.Strings(devs)
		}
		return reflect.DeepEqual(got, want), nil
	})
	if err != nil {
		t.Errorf("%v: records %v, want %v\n%s", err, got, want, recordFiles(t))
	}
}

// containerdLogSinceStart is containerd's log since its last start.
func containerdLogSinceStart(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(ctd.Opts.Log)
	if err != nil {
		return err.Error()
	}
	log := string(data)
	if i := strings.LastIndex(log, "=== cririg: containerd starting"); i >= 0 {
		log = log[i:]
	}
	return log
}

// nriLog is what containerd logged about NRI and its plugins since its
// last start.
func nriLog(t *testing.T) string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(containerdLogSinceStart(t), "\n") {
		if strings.Contains(strings.ToLower(l), "nri") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// layoutDevices are the RDMA devices vm-run.sh's /init made at boot.
func layoutDevices(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("/run/rdma-layout")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			devs = append(devs, f[1])
		}
	}
	return devs
}

// runRebooted is TestMain's part on the second boot: the node's disk holds
// rdma-netns (the CNI binary and the pre-installed NRI plugin), Multus and
// containerd's and kubelet's state, so nothing is installed; the node goes
// Ready by itself (a heartbeat from this kubelet: the API server still has
// the first boot's status).
func runRebooted(m *testing.M) int {
	err := cririg.Wait(4*time.Minute, "node "+node.Name+" Ready after the reboot", func() (bool, error) {
		if !kubelet.Alive() {
			return false, fmt.Errorf("kubelet exited")
		}
		n, err := cs.CoreV1().Nodes().Get(context.Background(), node.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(kubelet.Started.Truncate(time.Second)) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%v\nkubelet log:\n%s\n", err, kubelet.LogTail(40))
		return 1
	}
	fmt.Printf("node %s Ready %s after kubelet started (after the reboot)\n", node.Name, time.Since(kubelet.Started).Round(time.Second))
	rc := m.Run()
	printCalls()
	printCPU()
	return rc
}
