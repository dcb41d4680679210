//go:build e2e

package k8s

import (
	"debug/buildinfo"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/internal/versions"
)

// payloadVersions are the versions the payload was built with
// (/payload/versions.env, written by build-payload.sh from versions.env,
// which README's claims are checked against).
func payloadVersions(t *testing.T) map[string]string {
	t.Helper()
	v, err := versions.Read("/payload/versions.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"KUBERNETES_VERSION", "CONTAINERD_VERSION", "MULTUS_VERSION", "NRI_VERSION"} {
		if v[key] == "" {
			t.Fatalf("/payload/versions.env names no %s", key)
		}
	}
	return v
}

// The cluster runs the versions versions.env names: the API server and
// the node's kubelet, containerd, and Multus's shim as its init container
// installed it.
func TestNodeVersions(t *testing.T) {
	want := payloadVersions(t)
	n, err := cs.CoreV1().Nodes().Get(ctx(t), node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := n.Status.NodeInfo
	t.Logf("kubelet %s, runtime %s, kernel %s", info.KubeletVersion, info.ContainerRuntimeVersion, info.KernelVersion)
	if info.KubeletVersion != want["KUBERNETES_VERSION"] {
		t.Errorf("kubelet version %q, want %s", info.KubeletVersion, want["KUBERNETES_VERSION"])
	}
	sv, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Errorf("API server version: %v", err)
	} else if sv.GitVersion != want["KUBERNETES_VERSION"] {
		t.Errorf("API server version %q, want %s", sv.GitVersion, want["KUBERNETES_VERSION"])
	}
	// containerd built from its module says X.Y.Z+unknown (no git stamp).
	rt, _, _ := strings.Cut(strings.TrimPrefix(info.ContainerRuntimeVersion, "containerd://"), "+")
	if "v"+strings.TrimPrefix(rt, "v") != want["CONTAINERD_VERSION"] {
		t.Errorf("runtime version %q, want containerd %s", info.ContainerRuntimeVersion, want["CONTAINERD_VERSION"])
	}
	// The Go module Multus's programs were built from, as the binary
	// records it: the main module of `go build MODULE/cmd/multus-shim`.
	bi, err := buildinfo.ReadFile("/opt/cni/bin/multus-shim")
	if err != nil {
		t.Fatalf("the multus-shim Multus's init container installed: %v", err)
	}
	var multus string
	for _, m := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
		if m.Path == "gopkg.in/k8snetworkplumbingwg/multus-cni.v4" {
			multus = m.Version
		}
	}
	if multus != want["MULTUS_VERSION"] {
		t.Errorf("/opt/cni/bin/multus-shim built from Multus %q, want %s", multus, want["MULTUS_VERSION"])
	}
}

// containerd registered rdma-netns-nri with the NRI version versions.env
// names (the stub reports its own, from the binary's build information),
// and never warned that it uses a deprecated interface: NRI v0.12 has a
// dedicated RPC per event, and containerd 2.3 and later log "NRI plugin
// uses a deprecated interface." for a plugin that gets events through the
// old StateChange. Since containerd's last start (TestContainerdRestart),
// after which only this build's instances ran (TestHelm's upgrade runs an
// earlier build), and pods came and went.
func TestNRIPluginInterface(t *testing.T) {
	want := payloadVersions(t)["NRI_VERSION"]
	registered := 0
	for _, l := range strings.Split(containerdLogSinceStart(t), "\n") {
		if !strings.Contains(l, "rdma-netns") {
			continue
		}
		if strings.Contains(l, "registered as") {
			registered++
			t.Logf("%s", l)
			if !strings.Contains(l, "(with NRI version "+want+")") {
				t.Errorf("containerd registered our plugin with another NRI version than %s:\n%s", want, l)
			}
		}
		if strings.Contains(strings.ToLower(l), "deprecated") {
			t.Errorf("containerd warns of a deprecation for our plugin:\n%s", l)
		}
	}
	if registered == 0 {
		t.Errorf("containerd's log has no registration of rdma-netns-nri; its NRI lines:\n%s", nriLog(t))
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
			Containers:                    []corev1.Container{unprivilegedTools("tools", "3600")},
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
	wantOnlyRDMA(t, netns, n.RDMA)
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
