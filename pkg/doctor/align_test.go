package doctor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
)

// alignFixture is pod-a of the node fixture holding the NICs nics (RDMA
// device -> PCI function path under /sys/devices, netdev netN for the Nth),
// with GPUs on the node at the paths of gpus, and process 41 in the pod.
type alignFixture struct {
	*nodeFixture
	podA string
}

type fn struct {
	path string // under /sys/devices, e.g. pci0000:3a/0000:3a:02.0/0000:3b:00.0
	numa int
	// netdev names a NIC's netdev; "" = netN for the Nth NIC.
	netdev string
}

func newAlignFixture(t *testing.T, nics []fn, gpus []fn) *alignFixture {
	t.Helper()
	f := newNodeFixture(t)
	podA := filepath.Join(f.netnsDir, "pod-a")
	// A sysfs of its own: the fixture's pod-a has another NIC.
	tr := sysfstest.New(t)
	f.pods[podA] = tr
	var names []string
	chars := []string{"rdma_cm"}
	for i, n := range nics {
		placePCI(t, tr, n)
		name, netdev := fmt.Sprintf("mlx5_%d", 10+i), fmt.Sprintf("net%d", i+1)
		if n.netdev != "" {
			netdev = n.netdev
		}
		tr.Netdev(n.path, netdev)
		rdmaFixture(t, tr, f.env.DevRoot, n.path, name, netdev, "4: ACTIVE", 1, 10+i)
		f.kernel.uverbs[name] = uint32(10 + i)
		names = append(names, name)
		chars = append(chars, fmt.Sprintf("uverbs%d", 10+i))
	}
	f.kernel.in[podA] = names
	for _, g := range gpus {
		placePCI(t, f.host, g)
	}
	f.fp.proc("41", "python", "pod-a", "unlimited", "00000000a80425fb", 1<<30, chars...)
	// Device nodes need CAP_MKNOD: a regular file holding "major:minor"
	// stands in for one.
	f.env.Proc.CharDev = func(path string) (uint32, uint32, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, err
		}
		var major, minor uint32
		_, err = fmt.Sscanf(string(b), "%d:%d", &major, &minor)
		return major, minor, err
	}
	return &alignFixture{nodeFixture: f, podA: podA}
}

// placePCI makes the PCI function and the bridges above it, with their
// numa_node, in tree.
func placePCI(t *testing.T, tree *sysfstest.Tree, f fn) {
	t.Helper()
	parts := strings.Split(f.path, "/")
	tree.Device("", parts[0])
	for i := 2; i <= len(parts); i++ {
		if _, err := os.Lstat(filepath.Join(tree.Root, "bus", "pci", "devices", parts[i-1])); err == nil {
			continue
		}
		dir := tree.PCI(strings.Join(parts[:i], "/"))
		write(t, filepath.Join(dir, "numa_node"), fmt.Sprintf("%d\n", f.numa))
	}
}

// nvidia gives process pid /dev/nvidia<minor> and makes the driver list
// the GPU at addr with that minor.
func (f *alignFixture) nvidia(t *testing.T, pid string, minor int, addr string) {
	t.Helper()
	write(t, filepath.Join(f.fp.root, pid, "root", "dev", fmt.Sprintf("nvidia%d", minor)), fmt.Sprintf("195:%d", minor))
	write(t, filepath.Join(f.fp.root, "driver", "nvidia", "gpus", addr, "information"),
		fmt.Sprintf("Model: \t\t Tesla T4\nBus Location: \t %s\nDevice Minor: \t %d\n", addr, minor))
}

// render gives process pid /dev/dri/renderD<minor>, whose sysfs device is
// the function at devPath, as the DRM core registers it.
func (f *alignFixture) render(t *testing.T, pid string, minor int, devPath string) {
	t.Helper()
	name := fmt.Sprintf("renderD%d", minor)
	write(t, filepath.Join(f.fp.root, pid, "root", "dev", "dri", name), fmt.Sprintf("226:%d", minor))
	node := filepath.Join(f.host.Root, "devices", devPath, "drm", name)
	mkdir(t, node)
	if err := os.Symlink("../..", filepath.Join(node, "device")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(f.host.Root, "dev", "char"))
	rel, _ := filepath.Rel(filepath.Join(f.host.Root, "dev", "char"), node)
	if err := os.Symlink(rel, filepath.Join(f.host.Root, "dev", "char", fmt.Sprintf("226:%d", minor))); err != nil {
		t.Fatal(err)
	}
}

func gpuFindings(r *Report) map[string]Finding {
	out := map[string]Finding{}
	for _, fd := range findingsOf(r, "gpu-nic") {
		out[fd.Subject] = fd
	}
	return out
}

var (
	gpu3b = fn{path: "pci0000:3a/0000:3a:02.0/0000:3b:00.0", numa: 0}
	gpu5f = fn{path: "pci0000:5d/0000:5d:02.0/0000:5f:00.0", numa: 1}
	nic3c = fn{path: "pci0000:3a/0000:3a:02.0/0000:3c:00.0", numa: 0}
	nic5e = fn{path: "pci0000:5d/0000:5d:02.0/0000:5e:00.0", numa: 1}
)

// Two GPUs, one by NVIDIA's node and one by a DRM render node, each with
// a NIC of the pod under its own PCIe root.
func TestAlignAligned(t *testing.T) {
	f := newAlignFixture(t, []fn{nic3c, nic5e}, []fn{gpu3b, gpu5f})
	f.nvidia(t, "41", 0, "0000:3b:00.0")
	f.render(t, "41", 128, gpu5f.path)
	r := CheckPod(f.env, f.podA, 41)

	got := gpuFindings(r)
	if len(got) != 2 {
		t.Fatalf("gpu-nic findings %+v, want one per GPU", r.Findings)
	}
	for subj, want := range map[string]string{
		"GPU 0000:3b:00.0": "GPU 0000:3b:00.0 (pci0000:3a, NUMA 0) has NIC net1 (mlx5_10, 0000:3c:00.0) under its PCIe root",
		"GPU 0000:5f:00.0": "GPU 0000:5f:00.0 (pci0000:5d, NUMA 1) has NIC net2 (mlx5_11, 0000:5e:00.0) under its PCIe root",
	} {
		if fd := got[subj]; fd.Severity != OK || fd.Reason != want {
			t.Errorf("%s: %s %q, want OK %q", subj, fd.Severity, fd.Reason, want)
		}
	}
	g := r.Pod.GPUs
	if len(g) != 2 || g[0].PCIAddress != "0000:3b:00.0" || g[0].PCIeRoot != "pci0000:3a" || g[0].NUMANode != 0 ||
		strings.Join(g[0].FoundBy, " ") != "/dev/nvidia0" || strings.Join(g[0].NICsSameRoot, " ") != "mlx5_10" ||
		g[1].PCIAddress != "0000:5f:00.0" || strings.Join(g[1].FoundBy, " ") != "/dev/dri/renderD128" ||
		strings.Join(g[1].NICsSameRoot, " ") != "mlx5_11" || strings.Join(g[1].NICsSameNUMA, " ") != "mlx5_11" {
		t.Errorf("gpus %+v", g)
	}

	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{
		"GPU           FOUND BY             PCIE ROOT   NUMA  NICS UNDER ITS ROOT           NICS ON ITS NUMA NODE",
		"0000:3b:00.0  /dev/nvidia0         pci0000:3a  0     net1 (mlx5_10, 0000:3c:00.0)  net1 (mlx5_10, 0000:3c:00.0)",
		"0000:5f:00.0  /dev/dri/renderD128  pci0000:5d  1     net2 (mlx5_11, 0000:5e:00.0)  net2 (mlx5_11, 0000:5e:00.0)",
	} {
		if !strings.Contains(text.String(), "  "+row+"\n") {
			t.Errorf("text lacks %q:\n%s", row, text.String())
		}
	}
}

// NICs under other roots: each GPU is a WARN naming every NIC of the pod
// with its root, and the one on its NUMA node.
func TestAlignUnaligned(t *testing.T) {
	nic18 := fn{path: "pci0000:17/0000:17:02.0/0000:18:00.0", numa: 0}
	nic81 := fn{path: "pci0000:80/0000:80:02.0/0000:81:00.0", numa: 1}
	f := newAlignFixture(t, []fn{nic18, nic81}, []fn{gpu3b, gpu5f})
	f.nvidia(t, "41", 0, "0000:3b:00.0")
	f.nvidia(t, "41", 1, "0000:5f:00.0")
	r := CheckPod(f.env, f.podA, 41)

	got := gpuFindings(r)
	for subj, want := range map[string]string{
		"GPU 0000:3b:00.0": "no NIC of the pod is under the PCIe root of GPU 0000:3b:00.0 (pci0000:3a, NUMA 0): " +
			"net1 (mlx5_10, 0000:18:00.0) under pci0000:17, NUMA 0; net2 (mlx5_11, 0000:81:00.0) under pci0000:80, NUMA 1; " +
			"same NUMA node only: net1 (mlx5_10, 0000:18:00.0)",
		"GPU 0000:5f:00.0": "same NUMA node only: net2 (mlx5_11, 0000:81:00.0)",
	} {
		fd := got[subj]
		if fd.Severity != Warn || !strings.Contains(fd.Reason, want) || !strings.Contains(fd.Remedy, "resource.kubernetes.io/pcieRoot") {
			t.Errorf("%s: %s %q, want a WARN with %q", subj, fd.Severity, fd.Reason, want)
		}
	}
	if len(got) != 2 || r.ExitCode != 0 {
		t.Errorf("exit %d, findings %+v: want two warnings, which do not fail", r.ExitCode, r.Findings)
	}
	if g := r.Pod.GPUs; len(g) != 2 || len(g[0].NICsSameRoot) != 0 || strings.Join(g[0].NICsSameNUMA, " ") != "mlx5_10" {
		t.Errorf("gpus %+v", g)
	}
}

// More GPUs than NICs: each GPU is judged, the one without a NIC under
// its root and on its node a WARN without a NUMA match; a GPU without a
// NUMA node matches none.
func TestAlignGPUWithoutNIC(t *testing.T) {
	gpuNoNUMA := fn{path: "pci0000:d7/0000:d7:02.0/0000:d8:00.0", numa: -1}
	f := newAlignFixture(t, []fn{nic3c}, []fn{gpu3b, gpu5f, gpuNoNUMA})
	f.nvidia(t, "41", 0, "0000:3b:00.0")
	f.nvidia(t, "41", 1, "0000:5f:00.0")
	f.nvidia(t, "41", 2, "0000:d8:00.0")
	r := CheckPod(f.env, f.podA, 41)
	got := gpuFindings(r)
	if len(got) != 3 || got["GPU 0000:3b:00.0"].Severity != OK {
		t.Fatalf("findings %+v", r.Findings)
	}
	for _, subj := range []string{"GPU 0000:5f:00.0", "GPU 0000:d8:00.0"} {
		if fd := got[subj]; fd.Severity != Warn || strings.Contains(fd.Reason, "same NUMA node only") ||
			!strings.Contains(fd.Reason, "net1 (mlx5_10, 0000:3c:00.0) under pci0000:3a, NUMA 0") {
			t.Errorf("%s: %+v", subj, fd)
		}
	}
	if !strings.Contains(got["GPU 0000:d8:00.0"].Reason, "(pci0000:d7, no NUMA node)") {
		t.Errorf("no NUMA node: %+v", got["GPU 0000:d8:00.0"])
	}
}

// A pod with NICs and no GPU is not judged and shows no GPU table.
func TestAlignNoGPU(t *testing.T) {
	f := newAlignFixture(t, []fn{nic3c}, nil)
	// Neither nvidiactl nor a render node that is no PCI function (a
	// virtio-gpu's) is a GPU of the pod.
	write(t, filepath.Join(f.fp.root, "41", "root", "dev", "nvidiactl"), "195:255")
	virtio := fn{path: "pci0000:00/0000:00:02.0/virtio0", numa: -1}
	placePCI(t, f.host, fn{path: "pci0000:00/0000:00:02.0", numa: -1})
	f.host.Device("virtio", virtio.path)
	f.render(t, "41", 128, virtio.path)
	r := CheckPod(f.env, f.podA, 41)
	if len(findingsOf(r, "gpu-nic")) != 0 || len(r.Pod.GPUs) != 0 || len(r.Pod.NICs) != 1 || r.Pod.NICs[0].PCIeRoot != "pci0000:3a" {
		t.Fatalf("gpus %+v nics %+v findings %+v", r.Pod.GPUs, r.Pod.NICs, r.Findings)
	}
	var text bytes.Buffer
	r.WriteText(&text)
	if strings.Contains(text.String(), "GPUs of the pod") {
		t.Errorf("a GPU table without GPUs:\n%s", text.String())
	}
}

// --gpus names GPUs the pod's /dev does not show (a DRA claim's); with
// --json the pod carries its NICs and GPUs with their places.
func TestAlignGPUsFlagJSON(t *testing.T) {
	f := newAlignFixture(t, []fn{nic3c, nic5e}, []fn{gpu3b, gpu5f})
	f.nvidia(t, "41", 0, "0000:3b:00.0")
	var out, errOut bytes.Buffer
	code := runOn([]string{"--pid", "41", "--gpus", "0000:5f:00.0,0000:3b:00.0", "--json"}, &out, &errOut, f.env)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, errOut.String(), out.String())
	}
	var doc struct {
		Pod struct {
			NICs []map[string]any `json:"nics"`
			GPUs []map[string]any `json:"gpus"`
		} `json:"pod"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	gpus, nics := doc.Pod.GPUs, doc.Pod.NICs
	if len(gpus) != 2 || len(nics) != 2 {
		t.Fatalf("gpus %v nics %v", gpus, nics)
	}
	wantGPU := map[string]any{"pciAddress": "0000:3b:00.0", "pcieRoot": "pci0000:3a", "numaNode": 0.0,
		"foundBy": []any{"--gpus", "/dev/nvidia0"}, "nicsSameRoot": []any{"mlx5_10"}, "nicsSameNuma": []any{"mlx5_10"}}
	if fmt.Sprint(gpus[0]) != fmt.Sprint(wantGPU) {
		t.Errorf("gpus[0] = %v, want %v", gpus[0], wantGPU)
	}
	if fmt.Sprint(gpus[1]["foundBy"]) != "[--gpus]" || gpus[1]["pcieRoot"] != "pci0000:5d" {
		t.Errorf("gpus[1] = %v", gpus[1])
	}
	wantNIC := map[string]any{"device": "mlx5_11", "netdevs": []any{"net2"}, "pciAddress": "0000:5e:00.0", "pcieRoot": "pci0000:5d", "numaNode": 1.0}
	if fmt.Sprint(nics[1]) != fmt.Sprint(wantNIC) {
		t.Errorf("nics[1] = %v, want %v", nics[1], wantNIC)
	}

	// A GPU named that is no PCI function of this node is a WARN.
	out.Reset()
	r := CheckPod(f.env, f.podA, 41, "0000:99:00.0")
	if fd := gpuFindings(r)["GPU 0000:99:00.0"]; fd.Severity != Warn || !strings.Contains(fd.Reason, "no PCI function 0000:99:00.0 on this node") {
		t.Errorf("unknown GPU: %+v", fd)
	}
}

// --gpus takes PCI addresses only as sysfs spells them: each becomes a
// path element under /sys/bus/pci/devices.
func TestAlignGPUsFlagRefused(t *testing.T) {
	f := newAlignFixture(t, []fn{nic3c}, nil)
	for _, bad := range []string{"0000:3B:00.0", "3b:00.0", "0000:3b:00.0,", ",", "0000:3b:00.8", "../../../etc", "0000:3b:00.0;rm -rf /", "0000:3b:00.0,GPU-1234"} {
		var out, errOut bytes.Buffer
		if code := runOn([]string{"--pid", "41", "--gpus", bad}, &out, &errOut, f.env); code != 2 || out.Len() != 0 ||
			!strings.Contains(errOut.String(), "--gpus") || !strings.Contains(errOut.String(), "not a PCI address") {
			t.Errorf("--gpus %q: exit %d, stdout %q, stderr %q; want a usage error", bad, code, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := runOn([]string{"--gpus", "0000:3b:00.0"}, &out, &errOut, f.env); code != 2 || !strings.Contains(errOut.String(), "--pid or --netns") {
		t.Errorf("--gpus on the node view: exit %d, stderr %q", code, errOut.String())
	}
	got, err := ParseGPUs("0000:3b:00.0,0000:5f:00.0,0000:3b:00.0")
	if err != nil || strings.Join(got, " ") != "0000:3b:00.0 0000:5f:00.0" {
		t.Errorf("ParseGPUs = %v, %v", got, err)
	}
}

// A netdev's name is the pod's: in the GPU table and the finding it
// reaches the terminal escaped, one line.
func TestAlignEscapesNetdev(t *testing.T) {
	nic := nic3c
	nic.netdev = "n\x1b]0;owned\a\nFAKE"
	f := newAlignFixture(t, []fn{nic}, []fn{gpu3b})
	f.nvidia(t, "41", 0, "0000:3b:00.0")
	r := CheckPod(f.env, f.podA, 41)
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	if strings.ContainsAny(out, "\x1b\a") || strings.Contains(out, "\nFAKE") {
		t.Fatalf("raw control characters in the report:\n%q", out)
	}
	if !strings.Contains(out, `pci0000:3a  0     n\x1b]0;owned\x07\x0aFAKE (mlx5_10, 0000:3c:00.0)`) ||
		!strings.Contains(out, `has NIC n\x1b]0;owned\x07\x0aFAKE (mlx5_10, 0000:3c:00.0) under its PCIe root`) {
		t.Errorf("escaped netdev missing from the table or the finding:\n%s", out)
	}
}
