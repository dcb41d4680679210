//go:build e2e

package k8s

// Each GPU its own NIC (docs/dra.md): make e2e-k8s's alignment boot is a
// node VM with two PCIe roots on two NUMA nodes (vm-run.sh --pcie-roots 2
// --standin-gpus 2: eth1..eth4 under the first root, eth5..eth7 under the
// second, two stand-in GPUs under each). rdma-netns-dra publishes the
// seven NICs and the suite's stand-in GPU driver (e2e/k8s/gpudriver) the
// four GPUs, both with resource.kubernetes.io/pcieRoot as the kernel's
// sysfs gives it; conf's pair template asks the scheduler for each GPU's
// NIC under its root.

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/gpudriver"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// requirePairs makes the alignment layout a precondition of the run (run,
// before any setup) and of TestDRAPairs, which otherwise skips on a node
// VM without it: the Makefile sets it for make e2e-k8s's pairs boot,
// which exists only to run TestDRAPairs, so that a VM that lost
// --standin-gpus or its PCIe roots on the way fails the stage instead of
// passing it green.
var requirePairs = flag.Bool("k8s.pairs-required", false, "fail at once unless this VM booted with the alignment layout (vm-run.sh --pcie-roots 2 --standin-gpus 2: two GPUs and test NICs under each of two PCIe roots), rather than skip TestDRAPairs")

const (
	standinDriver = "gpu.e2e.rdma-netns.io"
	// gpuClass is the class conf/dra-claimtemplate-pairs.yaml names
	// (NVIDIA's); on the test node it selects the stand-in driver's GPUs,
	// so that the template applies as shipped.
	gpuClass = "gpu.nvidia.com"
	// What conf/dra-claimtemplate-pairs.yaml, nad-dra-rails.yaml and
	// pod-dra-pairs.yaml name.
	pairsTemplate  = "gpu-nic-pairs-4"
	pairsPod       = "nccl-pairs-0"
	pairsContainer = "nccl"
	pairsCount     = 4
	// pairsRoots are the node VM's PCIe roots besides bus 0, with
	// pairsCount/pairsRoots GPUs under each.
	pairsRoots = 2
	// anyTemplate is the pair template without its constraints, and
	// anyPod conf's pod on it: a claim that does not ask for alignment.
	anyTemplate = "gpu-nic-any-4"
	anyPod      = "nccl-any-0"
	// hogClaim holds every NIC of the second root, hogPod with it.
	hogClaim = "nics-of-one-root"
	hogPod   = "nic-hog"
)

// TestDRAPairs: a pod of conf's pair template gets, for each request pair
// gpuK/nicK, a GPU and a NIC under one PCIe root, as the claim's
// allocation and the pod's own sysfs show, and the doctor finds every GPU
// with its NIC. With the second root's NICs held by another claim, a new
// pod of the template stays Pending with the scheduler's reason, while the
// same template without its constraints is placed at once (the control:
// enough GPUs and NICs were free), across roots, and the doctor names that
// pod's GPUs without a NIC under their root.
func TestDRAPairs(t *testing.T) {
	if _, err := os.Stat(node.StandinGPUsFile); err != nil {
		if *requirePairs {
			t.Fatalf("-k8s.pairs-required: this node VM has no stand-in GPUs (%v): make e2e-k8s's alignment boot gives them (vm-run.sh --pcie-roots 2 --standin-gpus 2)", err)
		}
		t.Skip("this node VM has no stand-in GPUs: make e2e-k8s's alignment boot runs this (vm-run.sh --pcie-roots 2 --standin-gpus 2)")
	}
	p := newPairsRig(t)
	runSteps(t, []step{
		{"EachGPUItsNIC", p.eachGPUItsNIC},
		{"UnalignablePending", p.unalignablePending},
		{"UnalignedNamedByDoctor", p.unalignedNamed},
		{"AllHome", p.allHome},
	})
}

type pairsRig struct {
	dra draRig
	// gpus are the stand-in GPUs by device name: PCI address and root.
	gpus map[string]standinGPU
	// rootOf is each NIC's PCIe root, by PCI address, from the host's sysfs.
	rootOf map[string]string
	roots  []string // the two roots, in order
}

type standinGPU struct{ pci, root string }

// newPairsRig starts the DRA driver on every NIC under the roots, the
// stand-in GPU driver in this process with the class conf's template
// names, and applies conf's examples.
func newPairsRig(t *testing.T) *pairsRig {
	t.Helper()
	layout, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	p := &pairsRig{dra: draRig{t: t}, gpus: map[string]standinGPU{}, rootOf: map[string]string{}}
	for _, n := range layout {
		root := pciRoot(t, n.PCI)
		if root == node.Bus0Root { // eth0, beside the API's NIC
			continue
		}
		p.dra.nics = append(p.dra.nics, n)
		p.rootOf[n.PCI] = root
		if !slices.Contains(p.roots, root) {
			p.roots = append(p.roots, root)
		}
	}
	sort.Strings(p.roots)
	if len(p.roots) != 2 {
		t.Fatalf("NICs under roots %v, want two (vm-run.sh --pcie-roots 2): %s", p.roots, nicsText(p.dra.nics))
	}
	var pcis []string
	for _, g := range readStandinGPUs(t) {
		pcis = append(pcis, g.pci)
		p.gpus[gpudriver.DeviceName(g.pci)] = g
	}
	t.Logf("NICs %s under %v; stand-in GPUs %v", p.nicRoots(p.dra.nics), p.roots, p.gpus)

	p.dra.enable()
	t.Cleanup(p.cleanup)
	drv, err := gpudriver.New(standinDriver, pcis, "/sys")
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Start(ctx(t), cs, node.Name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Stop)
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx(t), gpudriver.DeviceClass(gpuClass, standinDriver), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, m := range []string{"dra-deviceclass", "dra-claimtemplate-pairs", "nad-dra-rails"} {
		applyManifest(t, m)
	}
	p.dra.slice = p.dra.waitSlice(len(p.dra.nics))
	p.dra.host = hostAtRest(t)
	for name, attrs := range p.dra.slice {
		pci := *attrs[pciBusIDAttr].StringValue
		if got := *attrs[pcieRootAttr].StringValue; got != p.rootOf[pci] {
			t.Fatalf("NIC %s (%s) published under %s, its sysfs path is under %s", name, pci, got, p.rootOf[pci])
		}
	}
	p.waitGPUSlice(t)
	return p
}

// readStandinGPUs reads vm-run.sh's list of stand-in GPUs.
func readStandinGPUs(t *testing.T) []standinGPU {
	t.Helper()
	data, err := os.ReadFile(node.StandinGPUsFile)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []standinGPU
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			t.Fatalf("%s: line %q, want PCI address, root, NUMA node", node.StandinGPUsFile, sc.Text())
		}
		gpus = append(gpus, standinGPU{pci: f[0], root: f[1]})
	}
	if len(gpus) != pairsCount {
		t.Fatalf("%s lists %d GPUs, want %d (two roots, two each): %s", node.StandinGPUsFile, len(gpus), pairsCount, data)
	}
	return gpus
}

// pciRoot is the PCIe root of a PCI function, from its sysfs path.
func pciRoot(t *testing.T, pci string) string {
	t.Helper()
	root, err := node.PCIRootOf(pci)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func (p *pairsRig) nicRoots(nics []rig.NIC) string {
	var s []string
	for _, n := range nics {
		s = append(s, fmt.Sprintf("%s(%s)", n.Netdev, p.rootOf[n.PCI]))
	}
	return strings.Join(s, " ")
}

// waitGPUSlice waits for the stand-in driver's four GPUs, each published
// under the root its sysfs path shows.
func (p *pairsRig) waitGPUSlice(t *testing.T) {
	t.Helper()
	var devs map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	err := cririg.Wait(2*time.Minute, fmt.Sprintf("%d GPUs of %s published for %s", pairsCount, standinDriver, node.Name), func() (bool, error) {
		var err error
		devs, err = sliceDevicesOf(ctx(t), standinDriver, node.Name)
		return err == nil && len(devs) == pairsCount, err
	})
	if err != nil {
		t.Fatalf("%v: %s", err, attrsText(devs))
	}
	for name, attrs := range devs {
		root := attrs[pcieRootAttr].StringValue
		if g, ok := p.gpus[name]; !ok || root == nil || g.root != *root || pciRoot(t, g.pci) != *root {
			t.Fatalf("GPU %s published with %s; the VM lists %+v", name, attrsText(map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{name: attrs}), g)
		}
	}
}

func (p *pairsRig) cleanup() {
	t := p.dra.t
	c := ctx(t)
	for _, name := range []string{pairsPod, anyPod, hogPod} {
		_ = cs.CoreV1().Pods("default").Delete(c, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	_ = cs.ResourceV1().ResourceClaims("default").Delete(c, hogClaim, metav1.DeleteOptions{})
	_ = cs.ResourceV1().ResourceClaimTemplates("default").Delete(c, anyTemplate, metav1.DeleteOptions{})
	_ = cs.ResourceV1().DeviceClasses().Delete(c, gpuClass, metav1.DeleteOptions{})
}

// pair is request pair k of a claim: its GPU and its NIC, with their roots.
type pair struct {
	gpu     standinGPU
	nic     rig.NIC
	nicRoot string
}

func (pr pair) String() string {
	return fmt.Sprintf("GPU %s (%s) + %s %s (%s)", pr.gpu.pci, pr.gpu.root, pr.nic.Netdev, pr.nic.PCI, pr.nicRoot)
}

// claimPairs reads the pod's claim: the UID, and for each k the devices of
// requests gpuK and nicK.
func (p *pairsRig) claimPairs(t *testing.T, pod string) (string, []pair) {
	t.Helper()
	claim := podClaim(t, "default", pod, "")
	name := claim.Name
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s of pod %s is not allocated", name, pod)
	}
	pairs := make([]pair, pairsCount)
	seen := map[string]bool{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		k, isGPU, err := pairIndex(r.Request)
		if err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		if seen[r.Request] {
			t.Fatalf("claim %s: request %s has two devices", name, r.Request)
		}
		seen[r.Request] = true
		if isGPU {
			g, ok := p.gpus[r.Device]
			if r.Driver != standinDriver || !ok {
				t.Fatalf("claim %s: result %+v is not a stand-in GPU", name, r)
			}
			pairs[k].gpu = g
			continue
		}
		attrs, ok := p.dra.slice[r.Device]
		if r.Driver != draDriver || !ok {
			t.Fatalf("claim %s: result %+v is not one of the driver's NICs", name, r)
		}
		pairs[k].nic, _ = p.dra.nicByPCI(*attrs[pciBusIDAttr].StringValue)
		pairs[k].nicRoot = *attrs[pcieRootAttr].StringValue
	}
	if len(seen) != 2*pairsCount {
		t.Fatalf("claim %s: results for %d requests, want gpu0..gpu%d and nic0..nic%d", name, len(seen), pairsCount-1, pairsCount-1)
	}
	return string(claim.UID), pairs
}

// pairIndex parses a request name of the pair template: gpuK or nicK.
func pairIndex(req string) (int, bool, error) {
	for _, kind := range []string{"gpu", "nic"} {
		if rest, ok := strings.CutPrefix(req, kind); ok {
			k, err := strconv.Atoi(rest)
			if err != nil || k < 0 || k >= pairsCount {
				break
			}
			return k, kind == "gpu", nil
		}
	}
	return 0, false, fmt.Errorf("request %q is not one of the template's gpu0..gpu%d, nic0..nic%d", req, pairsCount-1, pairsCount-1)
}

// inPodSysfs reads, in the pod's own sysfs, the PCI path of each
// attachment's netdev (net1..net4) and of each pair's GPU, and checks
// that netK+1 is nicK and sits under the root the claim says.
func (p *pairsRig) inPodSysfs(t *testing.T, pod string, pairs []pair) []string {
	t.Helper()
	var in []string
	for k := range pairs {
		in = append(in, fmt.Sprintf("/sys/class/net/net%d/device", k+1))
	}
	for _, pr := range pairs {
		in = append(in, "/sys/bus/pci/devices/"+pr.gpu.pci)
	}
	paths := resolveIn(t, "default", pod, pairsContainer, in...)
	var roots []string
	for k, pr := range pairs {
		nicPath, gpuPath := paths[k], paths[len(pairs)+k]
		if got := node.PCIFunction(nicPath); got != pr.nic.PCI {
			t.Errorf("%s: net%d is %s, PCI function %q, not the claim's nic%d %s", pod, k+1, nicPath, got, k, pr.nic.PCI)
		}
		if got := node.PCIRoot(nicPath); got != pr.nicRoot {
			t.Errorf("%s: net%d under %s in the pod's sysfs, the slice says %s", pod, k+1, got, pr.nicRoot)
		}
		if got := node.PCIRoot(gpuPath); got != pr.gpu.root {
			t.Errorf("%s: GPU %s under %s in the pod's sysfs, the slice says %s", pod, pr.gpu.pci, got, pr.gpu.root)
		}
		roots = append(roots, fmt.Sprintf("net%d %s, gpu%d %s", k+1, node.PCIRoot(nicPath), k, node.PCIRoot(gpuPath)))
	}
	return roots
}

// doctorGPUs runs the doctor on the pod with the claim's GPUs (--gpus: a
// stand-in has no device node to find them by) and returns its gpu-nic
// findings by GPU address.
func doctorGPUs(t *testing.T, pod string, pairs []pair) map[string]doctor.Finding {
	t.Helper()
	pid, err := podPid(ctx(t), "default", pod)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []string
	for _, pr := range pairs {
		gpus = append(gpus, pr.gpu.pci)
	}
	bin := cririg.CNIBinDir + "/rdma-netns"
	args := []string{"--pid", strconv.Itoa(pid), "--gpus", strings.Join(gpus, ",")}
	text, _, err := doctorrun.Text(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rdma-netns doctor %s (%s):\n%s", strings.Join(args, " "), pod, text)
	r, _, err := doctorrun.JSON(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]doctor.Finding{}
	for _, f := range findings(r, "gpu-nic") {
		out[strings.TrimPrefix(f.Subject, "GPU ")] = f
	}
	if len(out) != len(gpus) {
		t.Errorf("doctor on %s: gpu-nic findings for %v, want one per GPU of %v", pod, slices.Sorted(maps.Keys(out)), gpus)
	}
	return out
}

// conf's pod on conf's pair template: each pair under one root, in the
// claim and in the pod's sysfs; the RDMA devices are the NADs' names;
// the stand-in driver prepared the claim's GPUs; the doctor finds every
// GPU with its NIC. Deleted, its NICs come home and its record goes.
func (p *pairsRig) eachGPUItsNIC(t *testing.T) {
	start := time.Now()
	applyManifest(t, "pod-dra-pairs")
	waitRunning(t, "default", pairsPod, 5*time.Minute)
	t.Logf("%s Running %s after apply", pairsPod, time.Since(start).Round(time.Second))
	uid, pairs := p.claimPairs(t, pairsPod)
	perRoot := map[string]int{}
	for k, pr := range pairs {
		t.Logf("pair %d: %s", k, pr)
		if pr.gpu.root != pr.nicRoot {
			t.Errorf("pair %d of %s: %s: GPU and NIC under different roots", k, pairsPod, pr)
		}
		perRoot[pr.gpu.root]++
	}
	t.Logf("in %s's sysfs: %s", pairsPod, strings.Join(p.inPodSysfs(t, pairsPod, pairs), "; "))
	netns := mustNetns(t, "default", pairsPod)
	devs, err := rig.RDMAIn(netns)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(devs)
	if want := "rdma_r0 rdma_r1 rdma_r2 rdma_r3"; strings.Join(devs, " ") != want {
		t.Errorf("%s: RDMA devices %v in its netns, want %s (nad-dra-rails.yaml's names)", pairsPod, devs, want)
	}
	byName, err := rig.NICsByNameIn(p.dra.nics, netns)
	if err != nil {
		t.Fatal(err)
	}
	for k, pr := range pairs {
		if got := byName[fmt.Sprintf("net%d", k+1)]; got != pr.nic {
			t.Errorf("%s: net%d is %+v in its netns, want nic%d %s", pairsPod, k+1, got, k, pr.nic.Netdev)
		}
	}
	for _, f := range doctorGPUs(t, pairsPod, pairs) {
		if f.Severity != doctor.OK {
			t.Errorf("doctor on %s: %s %s: %s", pairsPod, f.Severity, f.Subject, f.Reason)
		}
	}
	var nics []rig.NIC
	for _, pr := range pairs {
		nics = append(nics, pr.nic)
	}
	recordOfClaim(t, pairsPod, uid, nics)
	p.deleteAndWaitHome(t, pairsPod, uid)
}

// deleteAndWaitHome deletes the pod and waits for it to be gone, every NIC
// home and its claim's record removed.
func (p *pairsRig) deleteAndWaitHome(t *testing.T, pod, claimUID string) {
	t.Helper()
	deletePod(t, "default", pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err := cririg.Wait(2*time.Minute, "pod "+pod+" gone", func() (bool, error) {
		_, err := cs.CoreV1().Pods("default").Get(ctx(t), pod, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	waitNICsHome(t, p.dra.nics)
	if claimUID == "" {
		return
	}
	if err := cririg.Wait(time.Minute, "the record of "+pod+"'s claim removed", func() (bool, error) {
		_, ok, err := drarecord.Dir(draRecordDir).Load(claimUID)
		return !ok && err == nil, err
	}); err != nil {
		t.Error(err)
	}
}

// With the second root's NICs held by another claim, four GPUs and four
// NICs are free, but not a NIC under each GPU's root: conf's pod waits
// unscheduled with the scheduler's reason and no sandbox.
func (p *pairsRig) unalignablePending(t *testing.T) {
	second := p.roots[1]
	var held []rig.NIC
	for _, n := range p.dra.nics {
		if p.rootOf[n.PCI] == second {
			held = append(held, n)
		}
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: hogClaim, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "nics",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draDeviceClass,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(len(held)),
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes["resource.kubernetes.io"].pcieRoot == %q`, second),
				}}},
			},
		}}}},
	}
	if _, err := cs.ResourceV1().ResourceClaims("default").Create(ctx(t), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hog := toolsPod("default", hogPod, "")
	delete(hog.Annotations, "k8s.v1.cni.cncf.io/networks") // it holds the NICs, attaches none
	hog.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nics", ResourceClaimName: new(hogClaim)}}
	createPod(t, hog)
	waitRunning(t, "default", hogPod, 3*time.Minute)
	t.Logf("%s holds %s: every NIC under %s", hogPod, p.nicRoots(held), second)

	applyManifest(t, "pod-dra-pairs")
	msg := waitPending(t, pairsPod, pendingSettle)
	t.Logf("%s waits: %s", pairsPod, msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("%s unschedulable for %q, want the scheduler's DRA reason (cannot allocate all claims)", pairsPod, msg)
	}
}

// The control, and the doctor's case: the pair template without its
// constraints (a claim that does not ask for alignment), created while
// conf's pod waits, is placed at once on the same free GPUs and NICs,
// every NIC under the first root, so the second root's GPUs have none
// under theirs; the doctor WARNs for exactly those GPUs.
func (p *pairsRig) unalignedNamed(t *testing.T) {
	tmpl, err := cs.ResourceV1().ResourceClaimTemplates("default").Get(ctx(t), pairsTemplate, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.Spec.Spec.Devices.Constraints) != pairsCount {
		t.Fatalf("template %s has %d constraints, want one per pair", pairsTemplate, len(tmpl.Spec.Spec.Devices.Constraints))
	}
	anyT := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: anyTemplate, Namespace: "default"}, Spec: tmpl.Spec}
	anyT.Spec.Spec.Devices.Constraints = nil
	if _, err := cs.ResourceV1().ResourceClaimTemplates("default").Create(ctx(t), anyT, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := confPairsPod(t)
	pod.Name = anyPod
	pod.Spec.ResourceClaims[0].ResourceClaimTemplateName = new(anyTemplate)
	createPod(t, pod)
	waitRunning(t, "default", anyPod, 5*time.Minute)
	if pd, err := cs.CoreV1().Pods("default").Get(ctx(t), pairsPod, metav1.GetOptions{}); err != nil || pd.Spec.NodeName != "" {
		t.Errorf("%s placed (node %q, %v) while the second root's NICs are held", pairsPod, pd.Spec.NodeName, err)
	}
	deletePod(t, "default", pairsPod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})

	_, pairs := p.claimPairs(t, anyPod)
	first, second := p.roots[0], p.roots[1]
	wantWarn := map[string]bool{}
	for k, pr := range pairs {
		t.Logf("pair %d: %s", k, pr)
		if pr.nicRoot != first {
			t.Errorf("%s: nic%d %s under %s, while every NIC under %s is held", anyPod, k, pr.nic.Netdev, pr.nicRoot, second)
		}
		if pr.gpu.root == second {
			wantWarn[pr.gpu.pci] = true
		}
	}
	if len(wantWarn) != pairsCount/2 {
		t.Fatalf("%s got %d GPUs under %s, want %d (every GPU of the node)", anyPod, len(wantWarn), second, pairsCount/2)
	}
	t.Logf("in %s's sysfs: %s", anyPod, strings.Join(p.inPodSysfs(t, anyPod, pairs), "; "))
	for gpu, f := range doctorGPUs(t, anyPod, pairs) {
		switch {
		case wantWarn[gpu] && f.Severity != doctor.Warn:
			t.Errorf("doctor on %s: GPU %s under %s, with no NIC of the pod there: %s %s, want WARN", anyPod, gpu, second, f.Severity, f.Reason)
		case wantWarn[gpu] && !strings.Contains(f.Reason, "no NIC of the pod is under the PCIe root"):
			t.Errorf("doctor on %s: GPU %s: WARN %q does not say why", anyPod, gpu, f.Reason)
		case !wantWarn[gpu] && f.Severity != doctor.OK:
			t.Errorf("doctor on %s: GPU %s under %s with the pod's NICs: %s %s, want OK", anyPod, gpu, first, f.Severity, f.Reason)
		}
	}
}

// confPairsPod is conf/pod-dra-pairs.yaml's pod as the overlay renders it.
func confPairsPod(t *testing.T) *corev1.Pod {
	t.Helper()
	data, err := os.ReadFile(node.ManifestDir + "/pod-dra-pairs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&pod); err != nil {
		t.Fatalf("pod-dra-pairs.yaml: %v", err)
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	if len(pod.Spec.ResourceClaims) != 1 {
		t.Fatalf("pod-dra-pairs.yaml: claims %+v, want one", pod.Spec.ResourceClaims)
	}
	return &pod
}

// Every pod deleted: every NIC and RDMA device home, no claim record left.
func (p *pairsRig) allHome(t *testing.T) {
	deletePod(t, "default", anyPod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	p.deleteAndWaitHome(t, hogPod, "")
	if err := cs.ResourceV1().ResourceClaims("default").Delete(ctx(t), hogClaim, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	waitNoClaimRecords(t)
	waitHostAsBefore(t, p.dra.host)
	p.dra.sliceUnchanged(t, "every pod deleted")
}
