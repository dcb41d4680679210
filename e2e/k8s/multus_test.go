//go:build e2e

package k8s

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// applyManifest applies a rendered overlay, retrying while the API server
// does not serve its kind yet (a CRD just created) or the namespace's
// service account is missing.
func applyManifest(t *testing.T, name string) {
	t.Helper()
	data, err := os.ReadFile(node.ManifestDir + "/" + name + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	var last error
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if last = apply(ctx(t), data); last == nil {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("apply %s: %v", name, last)
}

// rdmaOf is the RDMA device of a VM NIC.
func rdmaOf(t *testing.T, netdev string) string {
	t.Helper()
	return nicNamed(t, netdev).RDMA
}

// nicNamed is the VM NIC whose netdev is netdev.
func nicNamed(t *testing.T, netdev string) rig.NIC {
	t.Helper()
	return vmNIC(t, func(n rig.NIC) bool { return n.Netdev == netdev }, netdev)
}

// wantOnlyRDMA checks that the pod's netns holds dev and no other RDMA
// device.
func wantOnlyRDMA(t *testing.T, netns, dev string) {
	t.Helper()
	in, err := rig.RDMAIn(netns)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 1 || in[0] != dev {
		t.Errorf("pod's netns has RDMA devices %v, want [%s]", in, dev)
	}
}

// vmNIC is the VM NIC that match picks (the layout file's first); what
// names it in the failure.
func vmNIC(t *testing.T, match func(rig.NIC) bool, what string) rig.NIC {
	t.Helper()
	nics, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nics {
		if match(n) {
			return n
		}
	}
	t.Fatalf("the VM has no NIC %s", what)
	return rig.NIC{}
}

// conf/nad-host-device.yaml and conf/pod-nccl.yaml (overlays: the VM's
// NIC, static IPAM, the tools image, no GPU, small sizes), run by kubelet
// through containerd and Multus: the pod is Running with eth0 on the
// cluster network and net1 with its RDMA device; Multus wrote the
// network-status annotation through the API server; the container,
// unprivileged, sees its device alone, memlock unlimited and the annotated
// /dev/shm (the DaemonSet's NRI plugin); `kubectl delete pod` returns the
// device.
func TestNCCLPod(t *testing.T) {
	dev := rdmaOf(t, "eth1")
	applyManifest(t, "nad-host-device")
	created := time.Now()
	applyManifest(t, "pod-nccl")
	const ns, name = "default", "nccl-worker-0"
	waitRunning(t, ns, name, 3*time.Minute)
	t.Logf("pod Running %s after create (Multus thick, host-device, rdma-netns)", time.Since(created).Round(time.Millisecond))

	sb := sandboxOf(t, ns, name)
	checkThick(t, ns, name, sb.Id)
	netns, err := ctd.PodNetns(ctx(t), sb.Id)
	if err != nil {
		t.Fatal(err)
	}
	links, err := rig.NetdevsIn(netns)
	if err != nil {
		t.Fatal(err)
	}
	if !rig.Contains(links, "eth0") || !rig.Contains(links, "net1") {
		t.Errorf("pod's netdevs %v, want eth0 (cluster network) and net1", links)
	}
	wantOnlyRDMA(t, netns, dev)

	status, raw := networkStatus(t, ns, name)
	if attachment(status, "default/rdma-net", "net1") == nil {
		t.Errorf("network-status has no net1 of default/rdma-net:\n%s", raw)
	}
	t.Logf("network-status: %s", strings.Join(strings.Fields(raw), " "))

	out, stderr, err := execIn(t, ns, name, "nccl", "ibv_devices")
	if err != nil {
		t.Errorf("exec ibv_devices: %v\n%s", err, stderr)
	} else if devs := verbsDevices(out); len(devs) != 1 || devs[0] != dev {
		t.Errorf("ibv_devices in the pod lists %v, want [%s]:\n%s", devs, dev, out)
	}
	out, stderr, err = execIn(t, ns, name, "nccl", "sh", "-c", "ulimit -l; df -k /dev/shm")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) < 3 || lines[0] != "unlimited" {
		t.Errorf("ulimit -l; df -k /dev/shm in the pod: %q (%v) %s, want unlimited and a /dev/shm", out, err, stderr)
	} else if f := strings.Fields(lines[2]); len(f) < 2 || f[1] != strconv.Itoa(96*1024) {
		t.Errorf("/dev/shm in the pod: %q, want %d KiB (the annotated 96Mi)", lines[2], 96*1024)
	}

	// The DaemonSet's exporter, scraped on the node, labels the pod's
	// device with the pod's namespace and name.
	metrics := scrape(t)
	want := fmt.Sprintf(`host_device=%q,namespace=%q,netdev="net1",pod=%q`, dev, ns, name)
	if !strings.Contains(metrics, want) {
		t.Errorf("the exporter's /metrics has no series with %s:\n%s\nrecords:\n%s\nrdma-netns ADDs' CNI_ARGS:\n%s",
			want, grepLines(metrics, dev), recordFiles(t), addArgs(t))
	}

	deletePod(t, ns, name, metav1.DeleteOptions{})
	waitHome(t, dev)
}

func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func recordFiles(t *testing.T) string {
	t.Helper()
	var out []string
	for _, f := range rig.Records(cririg.RecordsDir) {
		data, _ := os.ReadFile(cririg.RecordsDir + "/" + f)
		out = append(out, f+": "+string(data))
	}
	return strings.Join(out, "\n")
}

func addArgs(t *testing.T) string {
	t.Helper()
	calls, err := cririg.Calls()
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, c := range calls {
		if c.Plugin == "rdma-netns" && c.Command == "ADD" {
			out = append(out, fmt.Sprintf("%s: %v", c.ContainerID, c.Args))
		}
	}
	return strings.Join(out, "\n")
}

// checkThick shows that Multus's thick plugin attached the pod: containerd
// ran multus-shim for the sandbox, and nothing of the chain itself (the
// daemon ran it), and the daemon's log (kubectl logs) has the ADD of the
// sandbox and of the pod's net1.
func checkThick(t *testing.T, ns, name, sandbox string) {
	t.Helper()
	calls, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, c := range calls {
		if c.ContainerID == sandbox && c.Command == "ADD" {
			ran = append(ran, c.Plugin)
		}
	}
	if !slices.Contains(ran, "multus-shim") || slices.Contains(ran, "rdma-netns") || slices.Contains(ran, "host-device") {
		t.Errorf("containerd's ADDs for the sandbox: %v, want multus-shim's and none of the NAD's chain (Multus's daemon runs it)", ran)
	}
	log := multusLog(ctx(t))
	for _, want := range []string{
		fmt.Sprintf("ADD finished CNI request ContainerID:%q", sandbox),
		fmt.Sprintf("Add: %s:%s:", ns, name),
	} {
		if !strings.Contains(log, want) {
			t.Errorf("Multus's daemon log has no %q:\n%s", want, grepLines(log, name))
		}
	}
	if l := grepLines(log, fmt.Sprintf("Add: %s:%s:", ns, name)); !strings.Contains(l, ":net1 ") {
		t.Errorf("Multus's daemon log has no ADD of net1 for the pod:\n%s", l)
	}
}
