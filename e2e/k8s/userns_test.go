//go:build e2e

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// Pods with hostUsers: false, each in a user namespace of its own (GA
// since Kubernetes 1.36): kubelet runs them only on a runtime handler
// whose OCI runtime has idmapped mounts (containerd asks it: `runc
// features`), which Debian bookworm's runc 1.1.5, the node's, does not
// have. On the node's runc-userns handler (runc at versions.env's
// RUNC_VERSION, node.UsernsHandler) two such RDMA pods get their devices,
// their device nodes and unlimited memlock from rdma-netns and its NRI
// plugin and exchange ib_write_bw traffic. Their device nodes are the
// node's own, bind-mounted (the runtime cannot create device nodes in a
// user namespace), so the node's mode applies: with the node's uverbs node
// root's alone, the pod's verbs fail and `rdma-netns doctor --pid` says so.
func TestUserNamespaces(t *testing.T) {
	handlers := runtimeHandlers(t)
	t.Logf("the node's runtime handlers and their user-namespace support: %v", handlers)
	if got, ok := handlers[""]; !ok || got {
		t.Errorf("the default runtime handler (Debian's runc 1.1.5): user namespaces %v (reported: %v), want false", got, ok)
	}
	if got := handlers[node.UsernsHandler]; !got {
		t.Errorf("runtime handler %s (%s): user namespaces %v, want true", node.UsernsHandler, node.UsernsRunc, got)
	}
	t.Run("NodeRuncRefused", testUsernsRefused)
	t.Run("TokenOnTmpfs", testUsernsToken)
	t.Run("Verbs", testUsernsVerbs)
}

// runtimeHandlers are the node's runtime handlers, as kubelet reports them
// in the Node's status, and whether each supports user namespaces.
func runtimeHandlers(t *testing.T) map[string]bool {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(ctx(t), node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hs := map[string]bool{}
	for _, h := range n.Status.RuntimeHandlers {
		hs[h.Name] = h.Features != nil && h.Features.UserNamespaces != nil && *h.Features.UserNamespaces
	}
	return hs
}

// usernsPod is toolsPod on network with hostUsers: false, of the
// RuntimeClass class ("": the node's default handler), without the
// service account token kubelet mounts by default (usernsToken says why).
func usernsPod(name, network, class string) *corev1.Pod {
	pod := toolsPod("default", name, network)
	pod.Spec.HostUsers = new(false)
	pod.Spec.AutomountServiceAccountToken = new(false)
	if class != "" {
		pod.Spec.RuntimeClassName = &class
	}
	return pod
}

// applyUsernsClass creates the RuntimeClass of the node's handler for
// user-namespaced pods.
func applyUsernsClass(t *testing.T) {
	t.Helper()
	class := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: node.UsernsHandler}, Handler: node.UsernsHandler}
	if _, err := cs.NodeV1().RuntimeClasses().Create(ctx(t), class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// The service account token kubelet mounts into every pod by default is
// a projected volume, a tmpfs, and the node's kernel (Debian bookworm's
// 6.1) has no idmapped mounts of tmpfs (Linux 6.3 added them): runc fails
// the container, and kubelet's event says so. A pod without the token
// (automountServiceAccountToken: false, and no secret, configMap,
// downwardAPI or memory-backed emptyDir volume) runs (Verbs).
func testUsernsToken(t *testing.T) {
	applyUsernsClass(t)
	const name = "userns-token"
	pod := usernsPod(name, "", node.UsernsHandler)
	delete(pod.Annotations, "k8s.v1.cni.cncf.io/networks")
	pod.Spec.AutomountServiceAccountToken = nil
	createPod(t, pod)
	t.Cleanup(func() { deletePod(t, "default", name, metav1.DeleteOptions{}) })
	msg := waitEvent(t, "default", name, "failed to set MOUNT_ATTR_IDMAP on /var/lib/kubelet/pods/", "/volumes/kubernetes.io~projected/kube-api-access-",
		"doesn't support idmap mounts on this kernel")
	t.Logf("the pod's event: %s", msg)
}

// On the node's default handler kubelet refuses the pod before it asks
// the runtime for a sandbox, and says why in the pod's events.
func testUsernsRefused(t *testing.T) {
	applyManifest(t, "nad-host-device")
	const name = "userns-refused"
	createPod(t, usernsPod(name, "rdma-net", ""))
	t.Cleanup(func() { deletePod(t, "default", name, metav1.DeleteOptions{}) })
	msg := waitEvent(t, "default", name, "Failed to create pod sandbox", "can't set `spec.hostUsers: false`, runtime does not support user namespaces")
	t.Logf("the pod's event: %s", msg)
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("pod %s, want Pending", p.Status.Phase)
	}
	if n := sandboxesOf(t, name); n != 0 {
		t.Errorf("containerd has %d sandboxes of the pod, want none", n)
	}
}

// usernsWorker is one of the two pods of testUsernsVerbs.
type usernsWorker struct {
	name, nadOverlay, network, nic string
	dev, uverbs, ip                string
}

func testUsernsVerbs(t *testing.T) {
	applyUsernsClass(t)
	workers := []*usernsWorker{
		{name: "userns-0", nadOverlay: "nad-host-device", network: "rdma-net", nic: "eth1"},
		{name: "userns-1", nadOverlay: "nad-host-device-eth2", network: "rdma-net-eth2", nic: "eth2"},
	}
	for _, w := range workers {
		w.dev = rdmaOf(t, w.nic)
		applyManifest(t, w.nadOverlay)
	}
	for _, w := range workers {
		createPod(t, usernsPod(w.name, w.network, node.UsernsHandler))
		t.Cleanup(func() {
			deletePod(t, "default", w.name, metav1.DeleteOptions{})
			deviceHome(t, w.dev)
		})
	}
	for _, w := range workers {
		took := waitRunning(t, "default", w.name, 5*time.Minute)
		t.Logf("%s Running %s after its creation", w.name, took.Round(time.Second))
		waitContainerUp(t, w.name)
		status, raw := networkStatus(t, "default", w.name)
		net1 := attachment(status, "default/"+w.network, "net1")
		if net1 == nil || len(net1.IPs) == 0 {
			t.Fatalf("%s: network-status has no net1 with an address:\n%s", w.name, raw)
		}
		w.ip = net1.IPs[0]
		checkUsernsWorker(t, w)
	}

	srv, cli := workers[0], workers[1]
	peer := func(w *usernsWorker) rig.Peer {
		return rig.Peer{Run: execRunner("default", w.name, "tools"), Dev: w.dev, IP: w.ip}
	}
	bw, err := rig.WriteBWBetween(ctx(t), peer(srv), peer(cli), 65536, 200)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ib_write_bw %s -> %s's memory, both in user namespaces: %d iters of %d bytes, average %.2f MB/s, peak %.2f MB/s",
		cli.name, srv.name, bw.Iters, bw.Bytes, bw.AverageMBps, bw.PeakMBps)

	doctorNamesNodeMode(t, srv)
}

// checkUsernsWorker: the pod's container runs in a user namespace of its
// own (its root is another uid on the node), lists its own RDMA device
// alone, has its uverbs node and rdma_cm, and memlock unlimited.
func checkUsernsWorker(t *testing.T, w *usernsWorker) {
	t.Helper()
	out, stderr, err := execIn(t, "default", w.name, "tools", "cat", "/proc/self/uid_map")
	if err != nil {
		t.Fatalf("%s: exec cat /proc/self/uid_map: %v\n%s", w.name, err, stderr)
	}
	if f := strings.Fields(out); len(f) != 3 || f[0] != "0" || f[1] == "0" {
		t.Errorf("%s: uid_map %q, want root mapped to another uid of the node", w.name, out)
	} else {
		t.Logf("%s: its root is uid %s on the node (uid_map %s)", w.name, f[1], strings.Join(f, " "))
	}
	out, stderr, err = execIn(t, "default", w.name, "tools", "ibv_devices")
	if err != nil {
		t.Fatalf("%s: exec ibv_devices: %v\n%s", w.name, err, stderr)
	}
	if devs := verbsDevices(out); len(devs) != 1 || devs[0] != w.dev {
		t.Errorf("%s: ibv_devices lists %v, want [%s] alone:\n%s", w.name, devs, w.dev, out)
	}
	out, stderr, err = execIn(t, "default", w.name, "tools", "ls", "/dev/infiniband")
	if err != nil {
		t.Fatalf("%s: exec ls /dev/infiniband: %v\n%s", w.name, err, stderr)
	}
	// Its uverbs node is named by the kernel inside the pod, as the NRI
	// plugin asks it: a device's node may change at a move (the kernel
	// gives it the lowest free minor again, and the two pods' devices move
	// at once), so the node's sysfs before the pod says nothing.
	nodes := strings.Fields(out)
	if len(nodes) != 2 || nodes[0] != "rdma_cm" || !strings.HasPrefix(nodes[1], "uverbs") {
		t.Fatalf("%s: /dev/infiniband has %q, want rdma_cm and one uverbs node", w.name, nodes)
	}
	w.uverbs = nodes[1]
	out, stderr, err = execIn(t, "default", w.name, "tools", "sh", "-c", "ulimit -l")
	if err != nil || strings.TrimSpace(out) != "unlimited" {
		t.Errorf("%s: ulimit -l %q (%v) %s, want unlimited", w.name, out, err, stderr)
	}
}

// doctorNamesNodeMode makes the node's uverbs node of w's device root's
// alone (0600), as a udev rule of the node could: the pod's container,
// whose node it is (bind-mounted), can no longer open its device, and
// `rdma-netns doctor --pid` of its process says why and what to do; with
// the mode as the kernel made it again, verbs open and the doctor finds
// nothing to fail.
func doctorNamesNodeMode(t *testing.T, w *usernsWorker) {
	t.Helper()
	path := "/dev/infiniband/" + w.uverbs
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	mode := fi.Mode().Perm()
	t.Logf("the node's %s: mode %04o", path, uint32(mode))
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(path, mode) })

	out, stderr, err := execIn(t, "default", w.name, "tools", "ibv_devinfo", "-d", w.dev)
	if err == nil {
		t.Errorf("%s: ibv_devinfo -d %s succeeded with the node's %s mode 0600:\n%s", w.name, w.dev, path, out)
	} else {
		t.Logf("%s: ibv_devinfo -d %s with the node's %s mode 0600: %v: %s", w.name, w.dev, path, err, strings.TrimSpace(out+stderr))
	}
	pid := containerPidOf(t, w.name)
	bin := cririg.CNIBinDir + "/rdma-netns"
	if text, _, err := doctorrun.Text(bin, "--pid", strconv.Itoa(pid)); err == nil {
		t.Logf("rdma-netns doctor --pid %d:\n%s", pid, text)
	}
	r, code, err := doctorrun.JSON(bin, "--pid", strconv.Itoa(pid))
	if err != nil {
		t.Fatal(err)
	}
	access := findings(r, "char-access")
	if code != 1 || len(access) != 1 || access[0].Severity != doctor.Fail {
		t.Fatalf("doctor --pid %d with %s mode 0600: exit %d, char-access findings %+v, want one FAIL", pid, path, code, access)
	}
	for _, want := range []string{path, "user namespace", "hostUsers: false"} {
		if !strings.Contains(access[0].Reason, want) {
			t.Errorf("doctor's reason lacks %q: %s", want, access[0].Reason)
		}
	}
	if !strings.Contains(access[0].Remedy, "mode 0666") {
		t.Errorf("doctor's remedy lacks the node's mode 0666: %s", access[0].Remedy)
	}

	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if out, stderr, err := execIn(t, "default", w.name, "tools", "ibv_devinfo", "-d", w.dev); err != nil {
		t.Errorf("%s: ibv_devinfo -d %s with the node's %s mode 0666: %v\n%s%s", w.name, w.dev, path, err, out, stderr)
	}
	r, code, err = doctorrun.JSON(bin, "--pid", strconv.Itoa(pid))
	if err != nil {
		t.Fatal(err)
	}
	if fails := failed(r); code != 0 || len(fails) != 0 {
		t.Errorf("doctor --pid %d with %s mode 0666: exit %d, failed %+v, want none", pid, path, code, fails)
	}
}

// waitContainerUp waits for the pod's container to be running since a
// minute, with no restart (the pod's phase is Running as soon as one
// container starts); else it fails with what kubelet, containerd and the
// events say of it.
func waitContainerUp(t *testing.T, name string) {
	t.Helper()
	var last corev1.ContainerStatus
	err := cririg.Wait(3*time.Minute, "container of "+name+" running", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, err
		}
		last = p.Status.ContainerStatuses[0]
		return last.State.Running != nil && last.RestartCount == 0, nil
	})
	if err != nil {
		t.Fatalf("%v\ncontainer status: %+v\nevents:\n%s\ncontainerd's CRI containers of the pod:\n%s\ncontainerd log:\n%s\nkubelet log:\n%s",
			err, last, events(t, "default", name), criContainers(t, name), grepTail("/var/log/containerd.log", "level=error", 20), kubelet.LogTail(30))
	}
}

// criContainers lists containerd's containers of a pod, with their state,
// exit code, reason and message.
func criContainers(t *testing.T, name string) string {
	t.Helper()
	resp, err := ctd.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.name": name},
	}})
	if err != nil {
		return err.Error()
	}
	s := ""
	for _, c := range resp.Containers {
		st, err := ctd.Runtime.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil {
			s += fmt.Sprintf("  %s %s: %v\n", c.Id[:12], c.Metadata.GetName(), err)
			continue
		}
		ss := st.Status
		s += fmt.Sprintf("  %s %s %s exit %d reason %q message %q\n", c.Id[:12], c.Metadata.GetName(), ss.State, ss.ExitCode, ss.Reason, ss.Message)
	}
	return s
}

// deviceHome waits for dev to be back on the host after its pod's
// deletion, and says what Multus's daemon and kubelet logged if not.
func deviceHome(t *testing.T, dev string) {
	t.Helper()
	err := cririg.Wait(2*time.Minute, dev+" back in the host netns", func() (bool, error) { return rig.HostHas(t, dev), nil })
	if err != nil {
		c := ctx(t)
		lines := strings.Split(multusLog(c), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Errorf("%v\nMultus's daemon log:\n%s\ncontainerd log:\n%s\nkubelet log:\n%s", err, strings.Join(lines, "\n"),
			grepTail("/var/log/containerd.log", "level=error", 20), kubelet.LogTail(30))
	}
}

// grepTail is the last n lines of a file that contain s.
func grepTail(path, s string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// containerPidOf is the node's pid of the first container of a pod of
// the default namespace on this node.
func containerPidOf(t *testing.T, name string) int {
	t.Helper()
	pid, err := podPid(ctx(t), "default", name)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// podPid is this node's pid of the first container of pod ns/name, which
// must run on this node: its container ID from the API server, the pid
// from containerd.
func podPid(c context.Context, ns, name string) (int, error) {
	p, err := cs.CoreV1().Pods(ns).Get(c, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if len(p.Status.ContainerStatuses) == 0 {
		return 0, fmt.Errorf("pod %s/%s has no container status", ns, name)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	st, err := ctd.Runtime.ContainerStatus(c, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("container %s of %s/%s: %v", id, ns, name, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		return 0, fmt.Errorf("container %s of %s/%s: no pid in its verbose status (%v)", id, ns, name, err)
	}
	return info.Pid, nil
}

func findings(r *doctor.Report, check string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

func failed(r *doctor.Report) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Severity == doctor.Fail {
			out = append(out, fmt.Sprintf("%s %s: %s", f.Check, f.Subject, f.Reason))
		}
	}
	return out
}
