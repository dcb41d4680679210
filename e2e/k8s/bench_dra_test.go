//go:build e2e

package k8s

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/deviceplugin"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	cniinstall "github.com/rdma-netns/rdma-netns/pkg/install"
)

// benchDRANICs are the counts of NICs per pod TestBenchDRA runs rounds of.
var benchDRANICs = flag.String("k8s.bench-dra-nics", "1,4", "TestBenchDRA: comma-separated counts of NICs per pod (eth1 on), rounds of each")

// The ways a pod gets n whole NICs that TestBenchDRA compares.
const (
	benchByClaim     = "claim"
	benchByClaimOnly = "claim alone"
	benchByDP        = "device plugin"
)

// TestBenchDRA prints the time from pod create to Running, and from
// delete to every NIC home, for a pod holding n NICs by a ResourceClaim
// through a NAD (rdma-netns-dra, conf's DeviceClass and NAD, a template
// asking n), by the claim alone (conf's claim-only template asking n: the
// claims entry attaches them, no NAD, no annotation) and for one holding
// n NICs of a device plugin resource (the suite's device plugin, n NADs
// naming the resource: Multus hands each its NIC, chain host-device then
// rdma-netns), on the same NICs, the three interleaved (make bench-k8s,
// -k8s.bench rounds). Figures only; each pod must hold every RDMA device
// it asked for, and every NIC must be home after it.
func TestBenchDRA(t *testing.T) {
	if *benchRounds < 1 {
		t.Skip("a benchmark: make bench-k8s runs it (-k8s.bench N)")
	}
	counts, err := attachmentCounts(*benchDRANICs)
	if err != nil {
		t.Fatal(err)
	}
	nics := benchNICs(t, slices.Max(counts))
	pcis := make([]string, len(nics))
	for i, n := range nics {
		pcis[i] = n.PCI
	}

	// The chart's claims-entry container would put the entry back within
	// 10 s of its removal: off, the bench takes the entry out and puts it
	// in itself, for the plain pods' rounds.
	d := &draRig{t: t, nics: nics, set: []string{"dra.claimsEntry=false"}}
	d.enable()
	t.Cleanup(d.cleanup)
	claimsEntry(t, true)
	for _, m := range []string{"dra-deviceclass", "dra-claimtemplate", "nad-dra", "dra-claimtemplate-attach"} {
		applyManifest(t, m)
	}
	for _, n := range counts {
		benchTemplate(t, draTemplate2, "bench-nics", n)
		benchTemplate(t, attachTemplate, "bench-attach", n)
	}
	d.slice = d.waitSlice(len(nics))

	dp, err := deviceplugin.New(nicResource, pcis, pluginapi.DevicePluginPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Stop)
	waitAllocatable(t, nicResource, int64(len(nics)))
	for i := range nics {
		nad(t, "default", fmt.Sprintf("bench-dp-%d", i), "", fmt.Sprintf("10.100.%d.1/29", 101+i), "", byResource(nicResource))
	}

	times := map[int]map[string][]podTimes{}
	for _, n := range counts {
		times[n] = map[string][]podTimes{}
	}
	plain := map[bool][]podTimes{}
	for i := range *benchRounds {
		// Pods with no claim, the node's primary network with the claims
		// entry and without it, in turn: three of each a round (they are
		// quick, and the goal, 1.05x, is narrow).
		for k := range 6 {
			with := (i+k)%2 == 0
			claimsEntry(t, with)
			name := fmt.Sprintf("bench-plain-%v-%d-%d", with, i, k)
			plain[with] = append(plain[with], plainPodTimes(t, name))
		}
		claimsEntry(t, true)
		for j, n := range counts {
			order := []string{benchByClaim, benchByClaimOnly, benchByDP}
			if (i+j)%2 == 1 {
				slices.Reverse(order)
			}
			for _, by := range order {
				name := fmt.Sprintf("bench-%s-%dnic-%d", strings.ReplaceAll(by, " ", ""), n, i)
				pt := d.benchDRAPod(t, name, by, n)
				times[n][by] = append(times[n][by], pt)
				t.Logf("%s: Running %s after create, gone with every NIC home %s after delete", name, pt.start.Round(time.Millisecond), pt.stop.Round(time.Millisecond))
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod create -> Running and delete -> gone with its NICs home (kubelet %s, Multus thick, containerd), by ResourceClaim against by device plugin, %d pods of each per count, interleaved\n", kubeletVersion(t), *benchRounds)
	fmt.Fprintf(&b, "TCG-emulated node (qemu, no KVM) on shared cores: the seconds are noisy and no hardware's; the ratio claim/device plugin is the figure\n")
	fmt.Fprintf(&b, "%-5s %-14s %10s %10s %10s %14s\n", "NICs", "NICs by", "start p50", "min", "max", "delete p50")
	for _, n := range counts {
		for _, by := range []string{benchByClaim, benchByClaimOnly, benchByDP} {
			s := stats(startsOf(times[n][by]))
			fmt.Fprintf(&b, "%-5d %-14s %9.2fs %9.2fs %9.2fs %13.2fs\n", n, by, s.p50, s.min, s.max, stats(stopsOf(times[n][by])).p50)
		}
		for _, by := range []string{benchByClaim, benchByClaimOnly} {
			fmt.Fprintf(&b, "%-5s %s/device plugin %s start p50, %s delete p50\n", "", by,
				ratio(stats(startsOf(times[n][by])).p50, stats(startsOf(times[n][benchByDP])).p50),
				ratio(stats(stopsOf(times[n][by])).p50, stats(stopsOf(times[n][benchByDP])).p50))
		}
	}
	for _, with := range []bool{true, false} {
		s := stats(startsOf(plain[with]))
		fmt.Fprintf(&b, "%-5d %-14s %9.2fs %9.2fs %9.2fs %13.2fs\n", 0, map[bool]string{true: "plain, entry", false: "plain, none"}[with], s.p50, s.min, s.max, stats(stopsOf(plain[with])).p50)
	}
	fmt.Fprintf(&b, "%-5s a pod with no claim, the claims entry in the primary network / not: %s start p50, %s delete-to-sandbox-stopped p50\n", "",
		ratio(stats(startsOf(plain[true])).p50, stats(startsOf(plain[false])).p50),
		ratio(stats(stopsOf(plain[true])).p50, stats(stopsOf(plain[false])).p50))
	fmt.Printf("=== K8S DRA BENCH BEGIN ===\n%s=== K8S DRA BENCH END ===\n", b.String())
}

// plainPodTimes starts a pod with no claim and no network but the
// cluster's and deletes it: from create to Running, and from delete to
// its sandbox stopped (the kubelet's StopPodSandbox, whose CNI DEL runs
// the whole primary chain, the claims entry's DEL too).
func plainPodTimes(t *testing.T, name string) podTimes {
	t.Helper()
	pod := toolsPod("default", name, "")
	pod.Annotations = nil
	pt := podTimes{start: startTimed(t, pod, 0)}
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := func() int {
		return sandboxesIn(t, map[string]string{"io.kubernetes.pod.uid": string(p.UID)},
			&runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY})
	}
	if ready() != 1 {
		t.Fatalf("pod %s Running without one ready sandbox", name)
	}
	deleted := time.Now()
	if err := cs.CoreV1().Pods("default").Delete(ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	for ready() > 0 {
		if time.Since(deleted) > time.Minute {
			t.Fatalf("pod %s: its sandbox still ready a minute after its delete", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pt.stop = time.Since(deleted)
	t.Logf("%s: Running %s after create, its sandbox stopped %s after delete", name, pt.start.Round(time.Millisecond), pt.stop.Round(time.Millisecond))
	return pt
}

// claimsEntry puts the claims entry into the node's primary network, or
// takes it out, as `rdma-netns install --claims-entry` and
// `--remove-claims-entry` do, and checks the file says so: Multus reads the
// cluster network's file at each pod's ADD.
func claimsEntry(t *testing.T, in bool) {
	t.Helper()
	change := cniinstall.RemoveClaimsEntry
	if in {
		change = cniinstall.EnsureClaimsEntry
	}
	path, _, err := change(filepath.Dir(node.MultusConf), "rdma-netns")
	if err != nil {
		t.Fatalf("claims entry %v: %v", in, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if has := strings.Contains(string(b), `"claims":true`) || strings.Contains(string(b), `"claims": true`); has != in {
		t.Fatalf("%s: the claims entry there is %v, want %v:\n%s", path, has, in, b)
	}
}

// benchTemplate is conf's template from asking n NICs, named prefix-<n>.
func benchTemplate(t *testing.T, from, prefix string, n int) {
	t.Helper()
	tpl, err := cs.ResourceV1().ResourceClaimTemplates("default").Get(ctx(t), from, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("conf's template %s: %v", from, err)
	}
	c := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, n), Namespace: "default"}, Spec: *tpl.Spec.DeepCopy()}
	c.Spec.Spec.Devices.Requests[0].Exactly.Count = int64(n)
	if _, err := cs.ResourceV1().ResourceClaimTemplates("default").Create(ctx(t), c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// benchDRAPod starts a pod holding n NICs the way by says, checks that it
// holds n RDMA devices of the bench's NICs, deletes it and returns both
// times; a claim's delete lasts until its claim is gone.
func (d *draRig) benchDRAPod(t *testing.T, name, by string, n int) podTimes {
	t.Helper()
	var pod *corev1.Pod
	if by != benchByDP {
		// The bench hands the same NICs out both ways in turn, which a node
		// never should (docs/dra.md): a NIC the device plugin's pod held
		// left the host, so the driver dropped it from its slice, and puts
		// it back at its next rescan (30 s). Untimed, the claim's pod is
		// created once every NIC is offered again, as on a node whose NICs
		// only DRA hands out.
		d.waitSliceUnchanged(t)
		pod = draPod(name, fmt.Sprintf("bench-nics-%d", n), n, 10)
		if by == benchByClaimOnly {
			pod = attachPod(name, fmt.Sprintf("bench-attach-%d", n))
		}
	} else {
		var nets []string
		for i := 0; i < n; i++ {
			nets = append(nets, fmt.Sprintf("bench-dp-%d", i))
		}
		pod = toolsPod("default", name, strings.Join(nets, ","))
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{nicResource: resource.MustParse(fmt.Sprint(n))}
	}
	start := startTimed(t, pod, n)
	in, err := rig.RDMAIn(mustNetns(t, "default", name))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, nic := range d.nics {
		if rig.Contains(in, nic.RDMA) {
			held++
		}
	}
	if held != n || len(in) != n {
		t.Fatalf("pod %s (%s): RDMA devices %v in its netns, want %d of %s", name, by, in, n, nicSpan(d.nics))
	}
	if by == benchByDP {
		return podTimes{start: start, stop: stopBenchPod(t, name, d.nics)}
	}
	// A claim's NICs are free for the next pod once its claim is gone (the
	// resourceclaim controller deletes it after the pod): until then the
	// scheduler cannot place a pod asking them. The delete's time runs to
	// that point too.
	claim, _ := d.claimNICs(t, name)
	deleted := time.Now()
	stopBenchPod(t, name, d.nics)
	if err := claimGone(t, claim, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return podTimes{start: start, stop: time.Since(deleted)}
}
