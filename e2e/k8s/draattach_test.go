//go:build e2e

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/linkconf"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// What conf's claim-only examples name (conf/dra-claimtemplate-attach.yaml,
// conf/pod-dra-attach.yaml).
const (
	attachConfPod  = "rdma-attach-0"
	attachTemplate = "rdma-rails-2"
	// attachSubnet is the one subnet the rig's "node network
	// configuration" puts the four NICs on (NIC i: .i+1), with a route to
	// 10.250.i.0/24 through .254 and a source-routing table 150+i.
	attachSubnet = "10.100.50"
)

// claimOnly: conf's claim-only template and pod, applied as shipped, and a
// second pod of the same template, written with nothing but the claim:
// no NAD, no networks annotation. Each pod's sandbox gets its two NICs as
// rail0 and rail1 with the addresses and routes they had on the host, its
// RDMA devices, Multus's network-status lists them, and ib_write_bw runs
// between the pods on each rail; once
// the pods are deleted every NIC is home with exactly the host
// configuration it had (addresses, routes of every table, MTU, up), and
// no record is left.
func (d *draRig) claimOnly(t *testing.T) {
	waitNICsHome(t, d.nics)
	before := d.configureHostNICs(t)
	applyManifest(t, "dra-claimtemplate-attach")
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates("default").Delete(ctx(t), attachTemplate, metav1.DeleteOptions{})
	})
	applyManifest(t, "pod-dra-attach")
	// attach-b opts out of the NRI plugin: its verbs nodes come from the
	// claim's CDI devices alone, and it is the client of the traffic.
	pb := attachPod("attach-b", attachTemplate)
	pb.Annotations = map[string]string{"rdma-netns.io/nri": "skip"}
	createPod(t, pb)
	start := time.Now()
	waitRunning(t, "default", attachConfPod, 4*time.Minute)
	waitRunning(t, "default", "attach-b", 4*time.Minute)
	t.Logf("both claim-only pods Running %s after their creation", time.Since(start).Round(time.Second))
	a := d.railsHold(t, attachConfPod, before)
	b := d.railsHold(t, "attach-b", before)
	verbsNodesByCDI(t, "attach-b", "tools", b)
	jobLine(t, attachConfPod, "app", a)
	bDevs := metadataRDMA(t, "attach-b", "tools", b)
	railsInNetworkStatus(t, attachConfPod, before, a)
	railsInNetworkStatus(t, "attach-b", before, b)
	for i := range a {
		srv := rig.Peer{Run: execRunner("default", attachConfPod, "app"), Dev: a[i].RDMA, IP: hostAddr(before, a[i])}
		// The client's device is the one its metadata file names.
		cli := rig.Peer{Run: execRunner("default", "attach-b", "tools"), Dev: bDevs[i], IP: hostAddr(before, b[i])}
		bw, err := rig.WriteBWBetween(ctx(t), srv, cli, 65536, 100)
		if err != nil {
			t.Fatalf("rail%d: %v\n%s: %s\nattach-b: %s", i, err, attachConfPod, netDiagOf(t, attachConfPod, "rail*"), netDiagOf(t, "attach-b", "rail*"))
		}
		t.Logf("ib_write_bw attach-b rail%d (%s) -> %s rail%d (%s): %d iters of %d bytes, average %.2f MB/s",
			i, b[i].RDMA, attachConfPod, i, a[i].RDMA, bw.Iters, bw.Bytes, bw.AverageMBps)
	}
	deletePods(t, "default", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, attachConfPod, "attach-b")
	var away []string
	if err := cririg.Wait(time.Minute, "the claim-only pods' NICs home", func() (bool, error) {
		var err error
		away, err = rig.Missing(d.nics)
		return len(away) == 0 && err == nil, err
	}); err != nil {
		links, _ := exec.Command(rig.IPTool, "-br", "link").CombinedOutput()
		var dels []string
		for _, l := range strings.Split(multusLog(ctx(t)), "\n") {
			if strings.Contains(l, "DEL") || strings.Contains(l, "Del") || strings.Contains(l, "rdma-netns") {
				dels = append(dels, l)
			}
		}
		if len(dels) > 40 {
			dels = dels[len(dels)-40:]
		}
		recs, _ := exec.Command("sh", "-c", "ls -l /var/lib/cni/rdma-netns; head -c 3000 /var/lib/cni/rdma-netns/*").CombinedOutput()
		t.Fatalf("%v; still away: %v\nthe host's links:\n%s\nthe claims entry's log (last 60 lines):\n%s\nMultus's DEL lines:\n%s\nrecords:\n%s",
			err, away, links, node.Tail("/var/log/rdma-netns/claims.log", 60), strings.Join(dels, "\n"), recs)
	}
	var now map[string]linkconf.Config
	if err := cririg.Wait(time.Minute, "every NIC's host configuration as before the pods", func() (bool, error) {
		now = hostConfigs(t, d.nics)
		return reflect.DeepEqual(now, before), nil
	}); err != nil {
		t.Fatalf("%v:\nnow    %+v\nbefore %+v", err, now, before)
	}
	waitNoClaimRecords(t)
	waitNoAttachRecords(t)
	d.sliceUnchanged(t, "the claim-only pods deleted")
	d.claimOnlyWithoutMultus(t, before)
	// Two pods refused at once, watched over one window.
	waitUnattached := d.claimNeverAttached(t)
	bad, badUID := d.claimConfigInvalid(t)
	unattached := waitUnattached()
	refuse(t, "default", bad, unattached)
	recordGone(t, badUID)
	deletePods(t, "default", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, bad.name, unattached.name)
	waitNICsHome(t, unattached.nics)
	waitNoClaimRecords(t)
}

// claimNeverAttached: a pod whose claimed NIC nothing attaches (a claim
// of conf's NAD-path template, and the pod names no network) gets its
// sandbox, but containerd refuses its container: the claim's CDI device
// resolves only once an ADD has put the NIC in the pod and written its
// spec. So the pod never runs without its NIC, whatever left it out of
// the sandbox (here its author; on a node, the claims entry missing from
// the primary network while the sandbox was made), and the NIC stays
// home. Without CDI devices such a pod ran, without its NIC. It creates
// the pod and returns what waits for the refusal and gives the pod for
// refuse to watch.
func (d *draRig) claimNeverAttached(t *testing.T) func() refusedPod {
	const pod = "dra-unattached"
	p := draPod(pod, draOneTemplate, 0, 0)
	p.Annotations = nil
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "nics"}}
	createPod(t, p)
	return func() refusedPod {
		ev := waitEventReason(t, "default", pod, "Failed", "CDI", "nic.rdma-netns.io/nic=")
		t.Logf("a claim pod whose NIC nothing attached: %s: %s", ev.Reason, ev.Message)
		_, nics := d.claimNICs(t, pod)
		return refusedPod{name: pod, why: "whose NIC nothing attached", nics: nics}
	}
}

// verbsNodesByCDI checks a claim pod that opted out of the NRI plugin:
// its container has exactly its NICs' verbs nodes (the uverbs node the
// kernel gave each RDMA device in the pod) and rdma_cm, from the claim's
// CDI devices, which containerd applied (the container's OCI spec has
// them and no NRI plugin's mark).
func verbsNodesByCDI(t *testing.T, pod, ctr string, nics []rig.NIC) {
	t.Helper()
	want := []string{"rdma_cm"}
	for _, n := range nics {
		want = append(want, uverbsOf(t, n.RDMA))
	}
	slices.Sort(want)
	out, stderr, err := execIn(t, "default", pod, ctr, "ls", "/dev/infiniband")
	if err != nil {
		t.Fatalf("pod %s: ls /dev/infiniband: %v\n%s", pod, err, stderr)
	}
	got := strings.Fields(out)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("pod %s: /dev/infiniband has %v, want %v: its NICs' verbs nodes and rdma_cm, no other", pod, got, want)
	}
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if by := adjustedBy(t, *p); by != "" {
		t.Errorf("pod %s opted out of the NRI plugin, but %s = %q", pod, nriAdjustedBy, by)
	}
	t.Logf("pod %s (no NRI plugin): /dev/infiniband %v, from its claim's CDI devices", pod, got)
}

// metadataFile is where the kubelet mounts the device metadata of the
// request "rails" of the pod's claim "rails" (a claim from a template).
const metadataFile = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/rails/rails/" + draDriver + "-metadata.json"

// metadataRDMA reads the device metadata file in the pod's container and
// checks that it gives each of nics (rail0, rail1 as the kernel has them
// in the pod) as the pod has it: its PCI address, its RDMA device, its
// interface. It returns the RDMA devices the file names, in rail order.
func metadataRDMA(t *testing.T, pod, ctr string, nics []rig.NIC) []string {
	t.Helper()
	out, stderr, err := execIn(t, "default", pod, ctr, "cat", metadataFile)
	if err != nil {
		t.Fatalf("pod %s: the device metadata file %s: %v\n%s", pod, metadataFile, err, stderr)
	}
	var m struct {
		APIVersion string `json:"apiVersion"`
		Requests   []struct {
			Name    string `json:"name"`
			Devices []struct {
				Name        string                                 `json:"name"`
				Attributes  map[string]resourceapi.DeviceAttribute `json:"attributes"`
				NetworkData *resourceapi.NetworkDeviceData         `json:"networkData"`
			} `json:"devices"`
		} `json:"requests"`
	}
	// A stream of the same object in each version the driver writes,
	// newest first; the first is the one to read.
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&m); err != nil {
		t.Fatalf("pod %s: the device metadata file: %v\n%s", pod, err, out)
	}
	if m.APIVersion != "metadata.resource.k8s.io/v1beta1" || len(m.Requests) != 1 || m.Requests[0].Name != "rails" || len(m.Requests[0].Devices) != len(nics) {
		t.Fatalf("pod %s: device metadata %s, want v1beta1 with request rails and its %d NICs", pod, out, len(nics))
	}
	str := func(a map[string]resourceapi.DeviceAttribute, k string) string {
		if v, ok := a[k]; ok && v.StringValue != nil {
			return *v.StringValue
		}
		return ""
	}
	var devs []string
	for i, d := range m.Requests[0].Devices {
		iface := fmt.Sprintf("rail%d", i)
		pci, rdma, netdev := str(d.Attributes, pciBusIDAttr), str(d.Attributes, draDriver+"/rdmaDevice"), str(d.Attributes, draDriver+"/netdev")
		if pci != nics[i].PCI || rdma != nics[i].RDMA || netdev != iface || d.NetworkData == nil || d.NetworkData.InterfaceName != iface {
			t.Errorf("pod %s: metadata of %s: PCI %s, RDMA %s, netdev %s, network data %+v; want %s, %s, %s as the pod has it", pod, d.Name, pci, rdma, netdev, d.NetworkData, nics[i].PCI, nics[i].RDMA, iface)
		}
		devs = append(devs, rdma)
	}
	t.Logf("pod %s: its device metadata names %v", pod, devs)
	return devs
}

// jobLine checks what conf's claim-only pod printed: the NCCL and UCX
// device lists its command built from its device metadata file, naming
// its NICs' RDMA devices as the pod has them, in rail order.
func jobLine(t *testing.T, pod, ctr string, nics []rig.NIC) {
	t.Helper()
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("NCCL_IB_HCA==%s,%s UCX_NET_DEVICES=%s:1,%s:1", nics[0].RDMA, nics[1].RDMA, nics[0].RDMA, nics[1].RDMA)
	if got := strings.TrimSpace(podLogs(t, *p, ctr)); got != want {
		t.Errorf("pod %s printed %q, want %q: its command builds them from the device metadata file", pod, got, want)
	}
}

// claimConfigInvalid: a claim whose configuration for the driver writes
// a key in the wrong case ("interfacename", which encoding/json alone
// would take for interfaceName) is allocated, but its Prepare fails: the
// kubelet's FailedPrepareDynamicResources names the request and the key,
// no record is written, the pod gets no sandbox and no container starts,
// and its NIC stays on the host. It returns the pod for refuse to watch,
// and its claim's UID.
func (d *draRig) claimConfigInvalid(t *testing.T) (refusedPod, string) {
	const pod, claimName = "attach-badconfig", "attach-badconfig"
	c := ctx(t)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "rails", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draDeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}}},
			Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{"rails"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: draDriver, Parameters: runtime.RawExtension{
					Raw: []byte(`{"apiVersion":"nic.rdma-netns.io/v1alpha1","kind":"NICConfig","interfacename":"rail"}`),
				}},
			}}},
		}},
	}
	created, err := cs.ResourceV1().ResourceClaims("default").Create(c, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims("default").Delete(context.Background(), claimName, metav1.DeleteOptions{})
	})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "rails", ResourceClaimName: new(claimName)}},
			Containers:                    []corev1.Container{unprivilegedTools("tools", "3600")},
		},
	}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "rails"}}
	createPod(t, p)
	ev := waitEventReason(t, "default", pod, "FailedPrepareDynamicResources", `"rails"`, `"interfacename"`)
	t.Logf("a claim configured with a key in the wrong case: %s: %s", ev.Reason, ev.Message)
	allocated, err := cs.ResourceV1().ResourceClaims("default").Get(c, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return refusedPod{name: pod, why: "with an invalid configuration", noSandbox: true, nics: d.allocatedNICs(t, allocated)}, string(created.UID)
}

// attachPod is a pod written with nothing but its claim of template: no
// NAD, no networks annotation.
func attachPod(name, template string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "rails", ResourceClaimTemplateName: new(template)}},
			Containers:                    []corev1.Container{unprivilegedTools("tools", "3600")},
		},
	}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "rails"}}
	return p
}

// claimOnlyWithoutMultus: the node without Multus (its 00-multus.conf
// set aside, so containerd runs the primary network, ptp and the claims
// entry, itself): conf's claim-only pod runs the same, its sandbox made
// by ptp and rdma-netns with no multus-shim call, and once deleted its
// NICs are home with their host configuration. Multus is back after.
func (d *draRig) claimOnlyWithoutMultus(t *testing.T, before map[string]linkconf.Config) {
	aside := node.MultusConf + ".e2e-aside"
	if err := os.Rename(node.MultusConf, aside); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		if err := os.Rename(aside, node.MultusConf); err != nil {
			t.Errorf("put %s back: %v", node.MultusConf, err)
			return
		}
		waitCNIConfig(t, true)
	}
	t.Cleanup(restore)
	waitCNIConfig(t, false)
	start := time.Now()
	applyManifest(t, "pod-dra-attach")
	waitRunning(t, "default", attachConfPod, 4*time.Minute)
	t.Logf("without Multus: %s Running %s after its creation", attachConfPod, time.Since(start).Round(time.Second))
	sb := sandboxOf(t, "default", attachConfPod).Id
	for plugin, want := range map[string]bool{"multus-shim": false, "ptp": true, "rdma-netns": true} {
		exits, err := cririg.Exits(plugin, "ADD", sb)
		if err != nil || (len(exits) > 0) != want || slices.ContainsFunc(exits, func(e string) bool { return e != "rc=0" }) {
			t.Errorf("without Multus: containerd's %s ADD of the sandbox exited %v (%v), want ran %v, rc=0", plugin, exits, err, want)
		}
	}
	d.railsHold(t, attachConfPod, before)
	deletePod(t, "default", attachConfPod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err := cririg.Wait(time.Minute, "the NICs home with their host configuration, without Multus", func() (bool, error) {
		away, err := rig.Missing(d.nics)
		return err == nil && len(away) == 0 && reflect.DeepEqual(hostConfigs(t, d.nics), before), nil
	}); err != nil {
		t.Fatalf("%v:\nnow    %+v\nbefore %+v\nthe claims entry's log:\n%s", err, hostConfigs(t, d.nics), before, node.Tail("/var/log/rdma-netns/claims.log", 30))
	}
	waitNoAttachRecords(t)
	restore()
}

// waitCNIConfig waits for containerd's loaded CNI configuration (its CRI
// status) to run Multus for pods (multus true) or not.
func waitCNIConfig(t *testing.T, multus bool) {
	t.Helper()
	if err := cririg.Wait(time.Minute, fmt.Sprintf("containerd's CNI configuration with Multus %v", multus), func() (bool, error) {
		st, err := ctd.Runtime.Status(ctx(t), &runtimeapi.StatusRequest{Verbose: true})
		if err != nil {
			return false, err
		}
		return strings.Contains(st.Info["cniconfig"], "multus-shim") == multus, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// configureHostNICs gives each of the driver's NICs what a node's
// network configuration gives a rail NIC: up, an address on the rail
// subnet, a route through the rail's gateway and a table of its own; the
// step's cleanup takes them away again. It returns each NIC's
// configuration, by netdev.
func (d *draRig) configureHostNICs(t *testing.T) map[string]linkconf.Config {
	t.Helper()
	for i, n := range d.nics {
		for _, argv := range [][]string{
			{"link", "set", "dev", n.Netdev, "up"},
			{"addr", "add", fmt.Sprintf("%s.%d/24", attachSubnet, i+1), "dev", n.Netdev},
			{"route", "add", fmt.Sprintf("10.250.%d.0/24", i), "via", attachSubnet + ".254", "dev", n.Netdev},
			{"route", "add", "default", "via", attachSubnet + ".254", "dev", n.Netdev, "table", fmt.Sprint(150 + i)},
		} {
			if out, err := exec.Command(rig.IPTool, argv...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v\n%s", strings.Join(argv, " "), err, out)
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range d.nics {
			_ = exec.Command(rig.IPTool, "addr", "flush", "dev", n.Netdev).Run()
			_ = exec.Command(rig.IPTool, "link", "set", "dev", n.Netdev, "down").Run()
		}
	})
	cfg := hostConfigs(t, d.nics)
	for _, n := range d.nics {
		if c := cfg[n.Netdev]; !c.Up || len(c.Addrs) != 1 || len(c.Routes) != 2 {
			t.Fatalf("%s in the host: %+v, want up with one address and two routes", n.Netdev, c)
		}
	}
	return cfg
}

// hostConfigs reads each NIC's configuration in the host.
func hostConfigs(t *testing.T, nics []rig.NIC) map[string]linkconf.Config {
	t.Helper()
	out := map[string]linkconf.Config{}
	for _, n := range nics {
		c, err := linkconf.Read(n.Netdev)
		if err != nil {
			t.Fatal(err)
		}
		out[n.Netdev] = c
	}
	return out
}

// hostAddr is the address nic had on the host, without its prefix.
func hostAddr(cfg map[string]linkconf.Config, nic rig.NIC) string {
	a, _, _ := strings.Cut(cfg[nic.Netdev].Addrs[0].CIDR, "/")
	return a
}

// railsHold checks the running claim-only pod: rail<k> is its claim's
// k-th NIC, with that NIC's RDMA device in the pod's netns (and no other),
// its host address and route, and the ARP settings of the template; it
// returns the NICs.
func (d *draRig) railsHold(t *testing.T, pod string, host map[string]linkconf.Config) []rig.NIC {
	t.Helper()
	claim, nics, netns := d.holdsAs(t, pod, 2, func(i int) string { return fmt.Sprintf("rail%d", i) })
	for i, nic := range nics {
		iface := fmt.Sprintf("rail%d", i)
		out, err := exec.Command("nsenter", "--net="+netns, "sh", "-c",
			fmt.Sprintf("%[1]s -4 -o addr show dev %[2]s; %[1]s route show dev %[2]s; cat /proc/sys/net/ipv4/conf/%[2]s/arp_ignore /proc/sys/net/ipv4/conf/%[2]s/arp_announce", rig.IPTool, iface)).CombinedOutput()
		if err != nil {
			t.Fatalf("pod %s: %s: %v\n%s", pod, iface, err, out)
		}
		route := fmt.Sprintf("10.250.%d.0/24 via %s.254", slices.Index(d.nics, nic), attachSubnet)
		if s := string(out); !strings.Contains(s, host[nic.Netdev].Addrs[0].CIDR) || !strings.Contains(s, route) || !strings.HasSuffix(strings.TrimSpace(s), "1\n2") {
			t.Errorf("pod %s: %s has\n%s\nwant %s's host address %s, its route %s and arp_ignore 1, arp_announce 2", pod, iface, s, nic.Netdev, host[nic.Netdev].Addrs[0].CIDR, route)
		}
	}
	t.Logf("pod %s: claim %s: rail0=%s(%s) rail1=%s(%s), with their host addresses", pod, claim, nics[0].Netdev, nics[0].RDMA, nics[1].Netdev, nics[1].RDMA)
	return nics
}

// railsInNetworkStatus checks what Multus wrote of the claim-only pod in
// its network-status: with no network of its own, each rail is there
// under the cluster network's name (the claims entry's result carries
// them after eth0), with its host address and the MAC it has in the pod,
// and eth0 alone is the default.
func railsInNetworkStatus(t *testing.T, pod string, host map[string]linkconf.Config, nics []rig.NIC) {
	t.Helper()
	status, raw := networkStatus(t, "default", pod)
	netns := mustNetns(t, "default", pod)
	var defaults []string
	for _, s := range status {
		if s.Default {
			defaults = append(defaults, s.Interface)
		}
	}
	if len(defaults) != 1 || defaults[0] != "eth0" {
		t.Errorf("pod %s: network-status's default interfaces %v, want eth0 alone:\n%s", pod, defaults, raw)
	}
	eth0 := slices.IndexFunc(status, func(s netStatus) bool { return s.Interface == "eth0" })
	for i, nic := range nics {
		iface := fmt.Sprintf("rail%d", i)
		out, err := exec.Command("nsenter", "--net="+netns, rig.IPTool, "-o", "link", "show", "dev", iface).CombinedOutput()
		if err != nil {
			t.Fatalf("pod %s: %s: %v\n%s", pod, iface, err, out)
		}
		_, mac, _ := strings.Cut(string(out), "link/ether ")
		mac, _, _ = strings.Cut(mac, " ")
		j := slices.IndexFunc(status, func(s netStatus) bool { return s.Interface == iface })
		if eth0 < 0 || j < 0 || status[j].Name != status[eth0].Name || !slices.Equal(status[j].IPs, []string{hostAddr(host, nic)}) || status[j].Mac != mac {
			t.Errorf("pod %s: network-status:\n%s\nwant %s under the network of eth0 with %s's host address %s and MAC %s", pod, raw, iface, nic.Netdev, hostAddr(host, nic), mac)
		}
	}
	t.Logf("pod %s: network-status: %s", pod, strings.Join(strings.Fields(raw), " "))
}

// waitNoAttachRecords waits for the plugin to hold no record of a claim's
// attachment (network claim-<UID>).
func waitNoAttachRecords(t *testing.T) {
	t.Helper()
	var left []string
	if err := cririg.Wait(time.Minute, "no record of a claim's attachment", func() (bool, error) {
		st, err := state.Open(config.DefaultStateDir)
		if err != nil {
			return false, err
		}
		recs, err := st.List()
		if err != nil {
			return false, err
		}
		left = nil
		for _, r := range recs {
			if strings.HasPrefix(r.Network, "claim-") {
				left = append(left, r.Network+"/"+r.IfName)
			}
		}
		return len(left) == 0, nil
	}); err != nil {
		t.Errorf("%v: %v", err, left)
	}
}

// removeClaimsEntry takes the claims entry out of the node's primary
// network, as the docs tell an operator to after turning dra.claimsEntry
// off (the chart leaves it, naming the binary it also leaves): the tests
// after TestDRA find the node's network as they expect it.
func removeClaimsEntry(t *testing.T) {
	t.Helper()
	out, err := exec.Command("/opt/cni/bin/rdma-netns", "install", "--remove-claims-entry").CombinedOutput()
	if err != nil {
		t.Errorf("rdma-netns install --remove-claims-entry: %v\n%s", err, out)
		return
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}
