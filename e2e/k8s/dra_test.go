//go:build e2e

package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/cdi"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// What conf/'s DRA examples name (conf/dra-*.yaml, conf/nad-dra.yaml).
const (
	// draConfPod is conf/pod-dra.yaml's pod (container "app").
	draConfPod     = "rdma-dra-0"
	draDriver      = drarecord.DriverName
	draTemplate2   = "rdma-nics-2"
	draNetwork     = "rdma-dra"
	draRecordDir   = drarecord.DefaultDir
	pcieRootAttr   = "resource.kubernetes.io/pcieRoot"
	pciBusIDAttr   = "resource.kubernetes.io/pciBusID"
	draOneTemplate = "rdma-nics-1"
	// draDeviceClass is conf/dra-deviceclass.yaml's class.
	draDeviceClass = "rdma-nic.rdma-netns.io"
)

// draNetdevs are the NICs the driver publishes in TestDRA (the chart's
// dra.pciAddresses lists theirs): four, so that two pods of conf's
// two-NIC template hold them all.
var draNetdevs = []string{"eth3", "eth4", "eth5", "eth6"}

// NICs by ResourceClaim (docs/dra.md): the chart installed with
// dra.enabled, publishing four of the node's NICs; pods from conf's
// ResourceClaimTemplate get their NICs from the scheduler's allocation
// through conf's NAD, whose chain is rdma-netns alone in its dra mode
// (it hands host-device the NIC the driver recorded for the pod). The
// steps share the node's state and run in order.
func TestDRA(t *testing.T) {
	nics := make([]rig.NIC, len(draNetdevs))
	for i, n := range draNetdevs {
		nics[i] = nicNamed(t, n)
	}
	d := &draRig{t: t, nics: nics}
	d.enable()
	t.Cleanup(d.cleanup)
	d.host = hostAtRest(t)
	for _, m := range []string{"dra-deviceclass", "dra-claimtemplate", "nad-dra"} {
		applyManifest(t, m)
	}
	d.applyOneNICTemplate()
	d.slice = d.waitSlice(len(nics))
	runSteps(t, []step{
		{"Accounts", d.accounts},
		{"TwoNICsEach", d.twoNICsEach},
		{"PendingUntilFree", d.pendingUntilFree},
		{"RaceForTheLastNIC", d.raceForLastNIC},
		{"DriverAndKubeletRestart", d.restarts},
		{"AdminAccessRefused", d.adminAccessRefused},
		{"AttachAbsent", d.attachAbsent},
		{"DriverAbsent", d.driverAbsent},
		{"AliasOfAnother", d.aliasOfAnother},
		{"AllHome", d.allHome},
		{"ClaimOnly", d.claimOnly},
	})
}

// step is a subtest of a test whose steps share the node's state.
type step struct {
	name string
	run  func(*testing.T)
}

// runSteps runs the steps in order and stops at the first that fails:
// the later ones start from the state it should have left.
func runSteps(t *testing.T, steps []step) {
	t.Helper()
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			t.Fatalf("%s failed; the steps after it need its state", s.name)
		}
	}
}

type draRig struct {
	t    *testing.T
	nics []rig.NIC
	// slice is the driver's devices as first published: name -> attributes.
	slice map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	// host is the host's netdevs and RDMA devices before the first pod.
	host []string
	// set is more of the chart's values (helm --set) for enable.
	set []string
}

func (d *draRig) nicByPCI(pci string) (rig.NIC, bool) {
	for _, n := range d.nics {
		if n.PCI == pci {
			return n, true
		}
	}
	return rig.NIC{}, false
}

// The chart's DRA driver (dra.enabled): a DaemonSet of its own, apart
// from conf/daemonset.yaml's, with its own ServiceAccount.
const (
	draDSName   = "rdma-netns-dra"
	draSelector = "app.kubernetes.io/name=rdma-netns-dra"
)

// enable renders the chart as `helm upgrade --set dra.enabled=true` would
// (the suite's image, the four NICs) and applies it over conf/daemonset.yaml,
// then waits for the driver's pod to run on the node.
func (d *draRig) enable() {
	t := d.t
	t.Helper()
	pcis := make([]string, len(d.nics))
	for i, n := range d.nics {
		pcis[i] = n.PCI
	}
	applyChartDRA(t, pcis, d.set...)
	d.waitDriver(true)
}

// chartDRA renders the chart with dra.enabled, the suite's image, the
// driver offering the NICs of PCI addresses pcis on every node (none: the
// chart's default, every NIC; what removeChartDRA deletes is the same),
// and the values of set (helm --set).
func chartDRA(t *testing.T, pcis []string, set ...string) []byte {
	t.Helper()
	sv, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	// helm template renders without the cluster: it is told the
	// cluster's version, which the chart's kubeVersion checks.
	args := []string{"template", release, chartDir, "-n", dsNamespace, "--kube-version", sv.GitVersion,
		"--set", "image.repository=" + imageRepo, "--set", "image.tag=" + newTag, "--set", "dra.enabled=true"}
	if len(pcis) > 0 {
		args = append(args, "--set", "dra.pciAddresses={"+strings.Join(pcis, ",")+"}")
	}
	for _, v := range set {
		args = append(args, "--set", v)
	}
	cmd := helmCmd(args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template with dra.enabled: %v\n%s", err, stderr.String())
	}
	return out
}

// applyChartDRA applies the chart with dra.enabled over the installed
// DaemonSet, the driver offering the NICs of PCI addresses pcis on every
// node; it does not wait for the pods.
func applyChartDRA(t *testing.T, pcis []string, set ...string) {
	t.Helper()
	if err := apply(ctx(t), chartDRA(t, pcis, set...)); err != nil {
		t.Fatalf("apply the chart with dra.enabled: %v", err)
	}
}

// removeChartDRA puts the chart back at its default as `helm upgrade
// --set dra.enabled=false` would: conf/daemonset.yaml applied over the
// installed DaemonSet, and what only dra.enabled renders (the driver's
// DaemonSet first, then its ServiceAccount, role, binding and slice
// policy) deleted. It does not wait for the pods.
func removeChartDRA(t *testing.T) {
	t.Helper()
	c := ctx(t)
	def, err := os.ReadFile(node.ManifestDir + "/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(c, def); err != nil {
		t.Fatalf("apply conf/daemonset.yaml: %v", err)
	}
	if err := deleteAbsent(c, chartDRA(t, nil), def); err != nil {
		t.Fatalf("delete the chart's DRA objects: %v", err)
	}
}

// waitDriver waits for the chart on the node as waitDriverOn does, and
// returns the node's driver pod (nil when !dra).
func (d *draRig) waitDriver(dra bool) *corev1.Pod {
	d.t.Helper()
	return waitDriverOn(d.t, dra, node.Name)[node.Name]
}

// waitDriverOn waits for the chart's pods on the nodes named: the
// DaemonSet's pods Ready with the suite's image and its latest template
// (rolled out), and one Ready pod of the driver's DaemonSet, rolled out
// and not being deleted, on each node when dra, none when not. It returns
// the driver's pods by node name.
func waitDriverOn(t *testing.T, dra bool, nodeNames ...string) map[string]*corev1.Pod {
	t.Helper()
	var drivers map[string]*corev1.Pod
	var last string
	err := cririg.Wait(6*time.Minute, fmt.Sprintf("the chart's pods on %v Ready, the DRA driver's %v", nodeNames, dra), func() (bool, error) {
		if _, done, why := daemonSetPodsReady(ctx(t), imageRepo+":"+newTag); !done {
			last = why
			return false, nil
		}
		if done, why, err := rolledOut(ctx(t), dsName); !done || err != nil {
			last = why
			return false, err
		}
		var done bool
		var err error
		drivers, done, last, err = driverPods(ctx(t), dra, nodeNames)
		return done, err
	})
	if err != nil {
		t.Fatalf("%v; last: %s\n%s%s%s", err, last, chartPodsState(dsSelector), chartPodsState(draSelector), nodesState())
	}
	return drivers
}

// rolledOut tells, as `kubectl rollout status` does, whether the
// DaemonSet name runs its latest template on every node it should, and
// why not.
func rolledOut(c context.Context, name string) (bool, string, error) {
	ds, err := cs.AppsV1().DaemonSets(dsNamespace).Get(c, name, metav1.GetOptions{})
	if err != nil {
		return false, "", err
	}
	st := ds.Status
	switch {
	case st.ObservedGeneration < ds.Generation:
		return false, fmt.Sprintf("DaemonSet %s: generation %d not observed yet (%d)", name, ds.Generation, st.ObservedGeneration), nil
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled || st.NumberAvailable < st.DesiredNumberScheduled:
		return false, fmt.Sprintf("DaemonSet %s: %d of %d pods updated, %d available", name, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable), nil
	}
	return true, "", nil
}

// driverPods checks the driver's pods on the nodes named: with dra, its
// DaemonSet rolled out and one pod on each node, Ready, of the suite's
// image, not being deleted (returned by node name); without, no pod of it
// on them. why says what is not so yet.
func driverPods(c context.Context, dra bool, nodeNames []string) (pods map[string]*corev1.Pod, done bool, why string, err error) {
	list, err := cs.CoreV1().Pods(dsNamespace).List(c, metav1.ListOptions{LabelSelector: draSelector})
	if err != nil {
		return nil, false, "", err
	}
	on := map[string][]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		on[p.Spec.NodeName] = append(on[p.Spec.NodeName], p)
	}
	pods = map[string]*corev1.Pod{}
	for _, n := range nodeNames {
		ps := on[n]
		if !dra {
			if len(ps) > 0 {
				return nil, false, fmt.Sprintf("driver pod %s still on %s", ps[0].Name, n), nil
			}
			continue
		}
		if len(ps) != 1 {
			return nil, false, fmt.Sprintf("%d driver pods on %s, want 1", len(ps), n), nil
		}
		p := ps[0]
		if !podReady(p) || p.DeletionTimestamp != nil || p.Spec.Containers[0].Image != imageRepo+":"+newTag {
			return nil, false, fmt.Sprintf("driver pod %s on %s: %s, deleting %v, image %s, %+v", p.Name, n, p.Status.Phase, p.DeletionTimestamp != nil, p.Spec.Containers[0].Image, p.Status.ContainerStatuses), nil
		}
		pods[n] = p
	}
	if !dra {
		return pods, true, "", nil
	}
	done, why, err = rolledOut(c, draDSName)
	return pods, done, why, err
}

// What the chart's accounts may do on the API server: the driver's token
// as the kubelet projects it (bound to the driver's pod, naming its node)
// creates a slice of the driver on its node, and the slice policy refuses
// one on another node; a token of the same account bound to no pod names
// no node and writes no slice; the exporter's account writes no slice;
// neither lists pods. Creates are dry runs: admission decides, nothing is
// stored.
func (d *draRig) accounts(t *testing.T) {
	p := d.waitDriver(true)
	tr, err := cs.CoreV1().ServiceAccounts(dsNamespace).CreateToken(ctx(t), p.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: new(int64(600)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s bound to pod %s: %v", p.Spec.ServiceAccountName, p.Name, err)
	}
	driver := tokenClient(t, tr.Status.Token)
	unbound := tokenClient(t, saToken(t, dsNamespace, p.Spec.ServiceAccountName))
	exporter := tokenClient(t, saToken(t, dsNamespace, dsName))
	create := func(c kubernetes.Interface, nodeName string) error {
		s := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-policy-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   draDriver,
				Pool:     resourceapi.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
				NodeName: &nodeName,
			},
		}
		_, err := c.ResourceV1().ResourceSlices().Create(ctx(t), s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	const policy = "ValidatingAdmissionPolicy '" + draDSName + "-slices'"
	for _, tc := range []struct {
		what string
		err  error
		want string // in the 403; "" allowed
	}{
		{"the driver's pod token, a slice of its node", create(driver, node.Name), ""},
		{"the driver's pod token, a slice of another node", create(driver, "e2e-other-node"), policy},
		{"the driver's account, a token bound to no pod", create(unbound, node.Name), "names no node"},
		{"the exporter's account", create(exporter, node.Name), "cannot create resource \"resourceslices\""},
	} {
		switch {
		case tc.want == "" && tc.err != nil:
			t.Errorf("%s: %v, want allowed", tc.what, tc.err)
		case tc.want != "" && (!apierrors.IsForbidden(tc.err) || !strings.Contains(tc.err.Error(), tc.want)):
			t.Errorf("%s: %v, want 403 saying %s", tc.what, tc.err, tc.want)
		case tc.err != nil:
			t.Logf("%s: %v", tc.what, tc.err)
		}
	}
	for name, c := range map[string]kubernetes.Interface{"driver's": driver, "exporter's": exporter} {
		if _, err := c.CoreV1().Pods("").List(ctx(t), metav1.ListOptions{Limit: 1}); !apierrors.IsForbidden(err) {
			t.Errorf("the %s account lists pods: %v, want 403", name, err)
		}
	}
}

// tokenClient is a client of the API server authenticating with token
// alone.
func tokenClient(t *testing.T, token string) kubernetes.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(restCfg)
	cfg.BearerToken = token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cleanup deletes the test's pods, puts the chart back at its default
// (conf/daemonset.yaml) as the other tests expect it, and removes the
// test's DRA objects.
func (d *draRig) cleanup() {
	t := d.t
	c := ctx(t)
	for _, name := range []string{draConfPod, "dra-b", "dra-c", "dra-one", "dra-race-1", "dra-race-2", "dra-alias", "dra-victim", "dra-noattach", "dra-plain", "dra-nodriver", attachConfPod, "attach-b", "attach-badconfig", "dra-unattached"} {
		_ = cs.CoreV1().Pods("default").Delete(c, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	removeChartDRA(t)
	d.waitDriver(false)
	removeClaimsEntry(t)
	_ = cs.ResourceV1().ResourceClaimTemplates("default").Delete(c, draOneTemplate, metav1.DeleteOptions{})
}

// applyOneNICTemplate is conf's template asking one NIC instead of two.
func (d *draRig) applyOneNICTemplate() {
	t := d.t
	t.Helper()
	tpl, err := cs.ResourceV1().ResourceClaimTemplates("default").Get(ctx(t), draTemplate2, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("conf/dra-claimtemplate.yaml's template: %v", err)
	}
	one := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: draOneTemplate, Namespace: "default"}, Spec: tpl.Spec}
	one.Spec.Spec.Devices.Requests = slices.Clone(one.Spec.Spec.Devices.Requests)
	r := one.Spec.Spec.Devices.Requests[0]
	ex := *r.Exactly
	ex.Count = 1
	r.Exactly = &ex
	one.Spec.Spec.Devices.Requests[0] = r
	if _, err := cs.ResourceV1().ResourceClaimTemplates("default").Create(ctx(t), one, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// sliceDevices is what the driver publishes for this node.
func (d *draRig) sliceDevices() (map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	return sliceDevicesOf(ctx(d.t), draDriver, node.Name)
}

// nodeSlices are driver's ResourceSlices of the node named nodeName.
func nodeSlices(c context.Context, driver, nodeName string) ([]resourceapi.ResourceSlice, error) {
	list, err := cs.ResourceV1().ResourceSlices().List(c, metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
	if err != nil {
		return nil, err
	}
	var out []resourceapi.ResourceSlice
	for _, s := range list.Items {
		if s.Spec.NodeName != nil && *s.Spec.NodeName == nodeName {
			out = append(out, s)
		}
	}
	return out, nil
}

// sliceDevicesOf is what driver publishes for the node named nodeName:
// device name -> attributes.
func sliceDevicesOf(c context.Context, driver, nodeName string) (map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	published, err := nodeSlices(c, driver, nodeName)
	if err != nil {
		return nil, err
	}
	devs := map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for _, s := range published {
		for _, dev := range s.Spec.Devices {
			devs[dev.Name] = dev.Attributes
		}
	}
	return devs, nil
}

// waitSlice waits for the node's slice to hold n devices, each one of the
// NICs by its PCI address, and returns it.
func (d *draRig) waitSlice(n int) map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t := d.t
	t.Helper()
	devs := waitSliceOn(t, node.Name, n)
	for name, attrs := range devs {
		pci := attrs[pciBusIDAttr].StringValue
		if pci == nil {
			t.Fatalf("device %s has no %s: %v", name, pciBusIDAttr, attrs)
		}
		if _, ok := d.nicByPCI(*pci); !ok {
			t.Fatalf("device %s is PCI function %s, not one of the NICs the chart named", name, *pci)
		}
		if attrs[pcieRootAttr].StringValue == nil {
			t.Errorf("device %s has no %s", name, pcieRootAttr)
		}
	}
	return devs
}

// sliceUnchanged: the slice is what it was at the start, whoever holds
// which NIC (a device a pod holds is invisible on the host, and stays
// published).
//
// Within one rescan of the driver: kubelet's DRA reconciler may unprepare
// a force-deleted pod's claim while the node still tears its sandbox
// down, and a scan then finds its NIC neither on the host nor recorded,
// until the next scan sees it home.
func (d *draRig) sliceUnchanged(t *testing.T, when string) {
	t.Helper()
	start := time.Now()
	var now map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	err := cririg.Wait(draRescan+15*time.Second, "the slice as before "+when, func() (bool, error) {
		var err error
		now, err = d.sliceDevices()
		return err == nil && reflect.DeepEqual(now, d.slice), err
	})
	if err != nil {
		t.Errorf("%s: the slice changed:\nnow    %s\nbefore %s", when, attrsText(now), attrsText(d.slice))
	} else if took := time.Since(start); took > 2*time.Second {
		t.Logf("%s: the slice as before %s later (the driver's next scan)", when, took.Round(time.Second))
	}
}

// draRescan is the chart's dra.rescan: how often the driver scans the NICs.
const draRescan = 30 * time.Second

// waitSliceOn waits for the driver to publish n devices for the node named
// nodeName, and returns them.
func waitSliceOn(t *testing.T, nodeName string, n int) map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	var devs map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	err := cririg.Wait(3*time.Minute, fmt.Sprintf("%d devices of %s published for %s", n, draDriver, nodeName), func() (bool, error) {
		var err error
		devs, err = sliceDevicesOf(ctx(t), draDriver, nodeName)
		return err == nil && len(devs) == n, err
	})
	if err != nil {
		t.Fatalf("%v: %v", err, devs)
	}
	return devs
}

func attrsText(devs map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) string {
	b, _ := json.Marshal(devs)
	return string(b)
}

// draPod is a tools pod holding a claim from template, with one
// attachment of conf's NAD per NIC (net1 the claim's first NIC, ...),
// each on a subnet of its own, as conf/pod-dra.yaml's (10.100.30.0/24,
// 10.100.31.0/24, where that pod is host 2).
func draPod(name, template string, nics, host int) *corev1.Pod {
	var nets []string
	for i := 0; i < nics; i++ {
		nets = append(nets, fmt.Sprintf(`{"name":%q,"interface":"net%d","ips":["10.100.%d.%d/24"],"cni-args":{"draIndex":%d}}`, draNetwork, i+1, 30+i, host, i))
	}
	p := toolsPod("default", name, "["+strings.Join(nets, ",")+"]")
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nics", ResourceClaimTemplateName: &template}}
	return p
}

// claimNICs is the pod's claim and the NICs its allocation holds, in the
// order of its results.
func (d *draRig) claimNICs(t *testing.T, pod string) (string, []rig.NIC) {
	t.Helper()
	claim := podClaim(t, "default", pod, "")
	return claim.Name, d.allocatedNICs(t, claim)
}

// allocatedNICs is the NICs the claim's allocation holds, in the order of
// its results.
func (d *draRig) allocatedNICs(t *testing.T, claim *resourceapi.ResourceClaim) []rig.NIC {
	t.Helper()
	name := claim.Name
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s is not allocated", name)
	}
	var nics []rig.NIC
	for _, r := range claim.Status.Allocation.Devices.Results {
		attrs, ok := d.slice[r.Device]
		if r.Driver != draDriver || !ok {
			t.Fatalf("claim %s: result %+v is not one of the driver's devices", name, r)
		}
		n, _ := d.nicByPCI(*attrs[pciBusIDAttr].StringValue)
		nics = append(nics, n)
	}
	return nics
}

// podClaim is the claim generated for the pod's resourceClaims entry
// named claim ("": its only one).
func podClaim(t *testing.T, ns, pod, claim string) *resourceapi.ResourceClaim {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(ctx(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sts := p.Status.ResourceClaimStatuses
	i := slices.IndexFunc(sts, func(s corev1.PodResourceClaimStatus) bool {
		return (claim == "" || s.Name == claim) && s.ResourceClaimName != nil
	})
	if i < 0 || (claim == "" && len(sts) != 1) {
		t.Fatalf("pod %s/%s: claim statuses %+v, want one generated claim %s", ns, pod, sts, claim)
	}
	c, err := cs.ResourceV1().ResourceClaims(ns).Get(ctx(t), *sts[i].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// holds checks the running pod: each netN is its claim's N-th NIC, with
// that NIC's RDMA device in the pod's netns and no other, none of them
// left on the node; it returns the NICs.
func (d *draRig) holds(t *testing.T, pod string, n int) []rig.NIC {
	t.Helper()
	claim, nics, _ := d.holdsAs(t, pod, n, func(i int) string { return fmt.Sprintf("net%d", i+1) })
	t.Logf("pod %s: claim %s: %s", pod, claim, nicsText(nics))
	return nics
}

// holdsAs is holds with the claim's i-th NIC called ifName(i) in the pod;
// it returns the claim, its NICs and the pod's netns.
func (d *draRig) holdsAs(t *testing.T, pod string, n int, ifName func(int) string) (string, []rig.NIC, string) {
	t.Helper()
	claim, nics := d.claimNICs(t, pod)
	if len(nics) != n {
		t.Fatalf("pod %s: claim %s holds %d NICs, want %d", pod, claim, len(nics), n)
	}
	netns := mustNetns(t, "default", pod)
	byName, err := rig.NICsByNameIn(d.nics, netns)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, nic := range nics {
		iface := ifName(i)
		if got, ok := byName[iface]; !ok || got != nic {
			t.Errorf("pod %s: %s is %+v, want the claim's NIC %d, %s (%s)", pod, iface, got, i, nic.Netdev, nic.PCI)
		}
		want = append(want, nic.RDMA)
		if rig.HostHas(t, nic.RDMA) {
			t.Errorf("pod %s: %s is still on the node", pod, nic.RDMA)
		}
	}
	in, err := rig.RDMAIn(netns)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(in)
	sort.Strings(want)
	if !slices.Equal(in, want) {
		t.Errorf("pod %s: RDMA devices %v in its netns, want %v", pod, in, want)
	}
	return claim, nics, netns
}

func nicsText(nics []rig.NIC) string {
	var s []string
	for i, n := range nics {
		s = append(s, fmt.Sprintf("net%d=%s(%s,%s)", i+1, n.Netdev, n.PCI, n.RDMA))
	}
	return strings.Join(s, " ")
}

// peer is attachment netN of a DRA pod as the traffic helpers drive it.
func draPeer(t *testing.T, pod string, i int, nic rig.NIC) rig.Peer {
	t.Helper()
	status, raw := networkStatus(t, "default", pod)
	a := attachment(status, "default/"+draNetwork, fmt.Sprintf("net%d", i+1))
	if a == nil || len(a.IPs) == 0 {
		t.Fatalf("pod %s: network-status has no net%d with an address:\n%s", pod, i+1, raw)
	}
	container := "tools"
	if pod == draConfPod {
		container = "app"
	}
	return rig.Peer{Run: execRunner("default", pod, container), Dev: nic.RDMA, IP: a.IPs[0]}
}

// claimReason is the scheduler's word for a pod whose claims no node
// can satisfy (its DynamicResources plugin), in the PodScheduled
// condition's message.
const claimReason = "cannot allocate all claims"

// pendingSettle is how long a pending pod is watched after the
// scheduler's reason, as refusedWindow a refused one.
const pendingSettle = refusedWindow

// waitPending waits for the scheduler to say that the pod's claims cannot
// be allocated, then for settle more; over the whole wait the pod is
// unscheduled, the node Ready and untainted (so the claims, not the
// node, keep it Pending) and no sandbox exists for the pod's UID. It
// returns the scheduler's message.
func waitPending(t *testing.T, pod string, settle time.Duration) string {
	t.Helper()
	var msg string
	var settleBy time.Time
	err := cririg.Wait(2*time.Minute+settle, "pod "+pod+" unschedulable for its claims, then "+settle.String()+" more", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx(t), pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if err := stillPending(t, p); err != nil {
			t.Fatalf("pod %s: %v\nevents:\n%s", pod, err, events(t, "default", pod))
		}
		if settleBy.IsZero() {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					if !strings.Contains(c.Message, claimReason) {
						t.Fatalf("pod %s unschedulable, but not for its claims: %q, want %q", pod, c.Message, claimReason)
					}
					msg, settleBy = c.Message, time.Now().Add(settle)
				}
			}
		}
		if !settleBy.IsZero() && time.Now().After(settleBy) {
			return true, nil
		}
		time.Sleep(time.Second)
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, events(t, "default", pod))
	}
	return msg
}

// stillPending says what is wrong when the pod is not waiting as it
// should: placed, past Pending, a sandbox of its UID on the node, or the
// node not Ready or tainted.
func stillPending(t *testing.T, p *corev1.Pod) error {
	t.Helper()
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		return fmt.Errorf("placed on %q, phase %s, while it should wait", p.Spec.NodeName, p.Status.Phase)
	}
	if n := sandboxesLabelled(t, map[string]string{"io.kubernetes.pod.uid": string(p.UID)}); n != 0 {
		return fmt.Errorf("%d sandboxes while it waits", n)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx(t), node.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(n.Spec.Taints) > 0 || n.Spec.Unschedulable {
		return fmt.Errorf("node %s tainted %v (unschedulable %v): the wait would prove nothing of the claims", n.Name, n.Spec.Taints, n.Spec.Unschedulable)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return fmt.Errorf("node %s not Ready (%s: %s)", n.Name, c.Reason, c.Message)
		}
	}
	return nil
}

// conf/pod-dra.yaml's pod and a second pod from the same two-NIC
// template hold the four NICs, each NIC as
// the attachment its claim's result order names, and RDMA traffic runs on
// each pair of NICs (ib_write_bw between the pods, net1 to net1 and net2
// to net2).
func (d *draRig) twoNICsEach(t *testing.T) {
	applyManifest(t, "pod-dra")
	createPod(t, draPod("dra-b", draTemplate2, 2, 1))
	start := time.Now()
	waitRunning(t, "default", draConfPod, 4*time.Minute)
	waitRunning(t, "default", "dra-b", 4*time.Minute)
	t.Logf("both pods Running %s after their creation", time.Since(start).Round(time.Second))
	a := d.holds(t, draConfPod, 2)
	b := d.holds(t, "dra-b", 2)
	for i := range a {
		bw, err := rig.WriteBWBetween(ctx(t), draPeer(t, "dra-b", i, b[i]), draPeer(t, draConfPod, i, a[i]), 65536, 100)
		if err != nil {
			t.Fatalf("net%d: %v\n%s: %s\ndra-b: %s", i+1, err, draConfPod, netDiag(t, draConfPod), netDiag(t, "dra-b"))
		}
		t.Logf("ib_write_bw rdma-dra-0 net%d (%s) -> dra-b net%d (%s): %d iters of %d bytes, average %.2f MB/s",
			i+1, a[i].RDMA, i+1, b[i].RDMA, bw.Iters, bw.Bytes, bw.AverageMBps)
	}
	d.recordOf(t, draConfPod)
	d.recordOf(t, "dra-b")
	d.sliceUnchanged(t, "two pods holding every NIC")
}

// recordOf checks the driver's record of the pod's one claim: on the
// node, for the pod, naming the claim's NICs in its results' order; it
// returns what identifies the record's file.
func (d *draRig) recordOf(t *testing.T, pod string) recordFile {
	t.Helper()
	claim, nics := d.claimNICs(t, pod)
	return d.recordNames(t, pod, claim, nics)
}

// recordNames checks that the claim's record is on the node, for the
// pod, and names nics (by PCI address, in order).
func (d *draRig) recordNames(t *testing.T, pod, claim string, nics []rig.NIC) recordFile {
	t.Helper()
	return recordOfClaim(t, pod, d.claimUID(t, claim), nics)
}

// recordOfClaim checks that the record of the claim of that UID is on the
// node, for the pod, and names nics (by PCI address, in order).
func recordOfClaim(t *testing.T, pod, uid string, nics []rig.NIC) recordFile {
	t.Helper()
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := drarecord.Dir(draRecordDir).Load(uid)
	if err != nil || !ok {
		t.Fatalf("pod %s: no record of its claim %s on the node (%v)", pod, uid, err)
	}
	var got, want []string
	for _, dev := range rec.Devices {
		got = append(got, dev.PCIAddress)
	}
	for _, n := range nics {
		want = append(want, n.PCI)
	}
	if rec.PodUID != string(p.UID) || !slices.Equal(got, want) {
		t.Errorf("pod %s (%s): the record of claim %s is for pod %s and names %v, want %v", pod, p.UID, uid, rec.PodUID, got, want)
	}
	return statRecord(t, uid)
}

// recordFile is a record's file as the node has it: a record rewritten
// (a second Prepare) has another inode.
type recordFile struct {
	ClaimUID string
	Inode    uint64
	Data     []byte
}

func statRecord(t *testing.T, claimUID string) recordFile {
	t.Helper()
	path := filepath.Join(draRecordDir, claimUID+".json")
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return recordFile{ClaimUID: claimUID, Inode: st.Ino, Data: data}
}

// sameRecord fails t unless the claim's record is the file it was, byte
// for byte: nothing prepared the claim again.
func sameRecord(t *testing.T, before recordFile, when string) {
	t.Helper()
	now := statRecord(t, before.ClaimUID)
	if now.Inode != before.Inode || !bytes.Equal(now.Data, before.Data) {
		t.Errorf("%s: the record of claim %s was written again: inode %d, was %d\nnow    %s\nbefore %s",
			when, before.ClaimUID, now.Inode, before.Inode, now.Data, before.Data)
	}
}

// preparesLogged are the lines of this node's driver pod's log that
// record a Prepare of the claim.
func preparesLogged(t *testing.T, claimUID string) []string {
	t.Helper()
	p := waitDriverOn(t, true, node.Name)[node.Name]
	// The API server reads the log from the kubelet, which may not serve
	// it yet just after its restart ("an error on the server").
	var out []byte
	if err := cririg.Wait(2*time.Minute, "the log of the driver's pod "+p.Name, func() (bool, error) {
		var err error
		out, err = cs.CoreV1().Pods(dsNamespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "dra"}).DoRaw(ctx(t))
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "prepare: claim") && strings.Contains(l, "("+claimUID+")") {
			lines = append(lines, l)
		}
	}
	return lines
}

// noPrepareLogged fails t if this node's driver logged a Prepare of the
// claim: the kubelet did not ask again.
func noPrepareLogged(t *testing.T, claimUID, when string) {
	t.Helper()
	for _, l := range preparesLogged(t, claimUID) {
		t.Errorf("%s: the driver was asked to prepare claim %s again: %s", when, claimUID, l)
	}
}

// onlyRecordAnswered fails t unless every Prepare of the claim this
// node's driver logged was answered from its record ("already
// recorded"): none chose the NICs again.
func onlyRecordAnswered(t *testing.T, claimUID, when string) {
	t.Helper()
	lines := preparesLogged(t, claimUID)
	for _, l := range lines {
		if !strings.Contains(l, "already recorded") {
			t.Errorf("%s: the driver prepared claim %s anew: %s", when, claimUID, l)
		}
	}
	t.Logf("%s: the kubelet asked the driver to prepare claim %s %d time(s), each answered from its record", when, claimUID, len(lines))
}

// recordGone fails t unless the record directory is there and holds no
// record of the claim.
func recordGone(t *testing.T, claimUID string) {
	t.Helper()
	if st, err := os.Stat(draRecordDir); err != nil || !st.IsDir() {
		t.Fatalf("the record directory %s: %v", draRecordDir, err)
	}
	if _, ok, err := drarecord.Dir(draRecordDir).Load(claimUID); ok || err != nil {
		t.Errorf("the record of claim %s is still on the node (%v)", claimUID, err)
	}
}

// A third pod asking two NICs while none is free stays Pending with the
// scheduler's reason and no sandbox; once rdma-dra-0 (conf's pod) is deleted (its NICs
// home, its claim gone) it runs with rdma-dra-0's NICs.
func (d *draRig) pendingUntilFree(t *testing.T) {
	aClaim, aNICs := d.claimNICs(t, draConfPod)
	aUID := d.recordNames(t, draConfPod, aClaim, aNICs).ClaimUID
	createPod(t, draPod("dra-c", draTemplate2, 2, 3))
	msg := waitPending(t, "dra-c", pendingSettle)
	t.Logf("dra-c waits: %s", msg)
	freed := time.Now()
	deletePod(t, "default", draConfPod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	waitRunning(t, "default", "dra-c", 4*time.Minute)
	t.Logf("dra-c Running %s after %s's deletion:\n%s", time.Since(freed).Round(time.Second), draConfPod, eventTimeline(t, "default", "dra-c", freed))
	noPrepareRefused(t, "dra-c", draConfPod, freed)
	c := d.holds(t, "dra-c", 2)
	if !sameNICs(c, aNICs) {
		t.Errorf("dra-c holds %s, want rdma-dra-0's former %s", nicsText(c), nicsText(aNICs))
	}
	if err := claimGone(t, aClaim, time.Minute); err != nil {
		t.Error(err)
	}
	recordGone(t, aUID)
	d.sliceUnchanged(t, "dra-c holding rdma-dra-0's NICs")
}

// noPrepareRefused fails the test if the pod that waited for the NICs of
// the pod deleted at freed had its Prepare refused since: the scheduler
// gives it those NICs at once, and the driver's Prepare waits for them to
// come home (--busy-wait) rather than refuse, which kubelet would retry
// only at its next sync of the pod, 60 to 90 s later.
func noPrepareRefused(t *testing.T, pod, freedBy string, freed time.Time) {
	t.Helper()
	if s := failedSince(t, "default", pod, "FailedPrepareDynamicResources", freed); s != "" {
		t.Errorf("%s's Prepare was refused after %s's deletion, rather than waiting for its NICs to come home:\n%s", pod, freedBy, s)
	}
}

// claimGone waits for the claim of that name in "default" to be deleted.
func claimGone(t *testing.T, name string, timeout time.Duration) error {
	t.Helper()
	return cririg.Wait(timeout, "claim "+name+" deleted", func() (bool, error) {
		_, err := cs.ResourceV1().ResourceClaims("default").Get(ctx(t), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// claimUIDs remembers claims' UIDs by name: a deleted claim's record is
// found by the UID it had.
var claimUIDs = map[string]string{}

func (d *draRig) claimUID(t *testing.T, name string) string {
	if uid, ok := claimUIDs[name]; ok {
		return uid
	}
	c, err := cs.ResourceV1().ResourceClaims("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	claimUIDs[name] = string(c.UID)
	return string(c.UID)
}

func sameNICs(a, b []rig.NIC) bool {
	key := func(ns []rig.NIC) []string {
		var s []string
		for _, n := range ns {
			s = append(s, n.PCI)
		}
		sort.Strings(s)
		return s
	}
	return slices.Equal(key(a), key(b))
}

// With one NIC free, two pods asking one each are created at once: one
// runs, the other waits unscheduled with no sandbox, and no NIC is held
// twice; the loser runs once the winner is deleted.
func (d *draRig) raceForLastNIC(t *testing.T) {
	deletePod(t, "default", "dra-b", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	createPod(t, draPod("dra-one", draOneTemplate, 1, 4))
	waitRunning(t, "default", "dra-one", 4*time.Minute)
	held := append(d.holds(t, "dra-c", 2), d.holds(t, "dra-one", 1)...)
	for _, p := range []string{"dra-race-1", "dra-race-2"} {
		createPod(t, draPod(p, draOneTemplate, 1, 5+len(p)%2))
	}
	var winner, loser string
	err := cririg.Wait(4*time.Minute, "one of dra-race-1, dra-race-2 Running", func() (bool, error) {
		for _, p := range []string{"dra-race-1", "dra-race-2"} {
			pod, err := cs.CoreV1().Pods("default").Get(ctx(t), p, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if pod.Status.Phase == corev1.PodRunning {
				winner = p
			}
		}
		return winner != "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	loser = map[string]string{"dra-race-1": "dra-race-2", "dra-race-2": "dra-race-1"}[winner]
	held = append(held, d.holds(t, winner, 1)...)
	msg := waitPending(t, loser, pendingSettle)
	t.Logf("%s runs; %s waits: %s", winner, loser, msg)
	seen := map[string]bool{}
	for _, n := range held {
		if seen[n.PCI] {
			t.Errorf("NIC %s (%s) held twice: %s", n.Netdev, n.PCI, nicsText(held))
		}
		seen[n.PCI] = true
	}
	freed := time.Now()
	deletePod(t, "default", winner, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	waitRunning(t, "default", loser, 4*time.Minute)
	t.Logf("%s Running %s after %s's deletion:\n%s", loser, time.Since(freed).Round(time.Second), winner, eventTimeline(t, "default", loser, freed))
	noPrepareRefused(t, loser, winner, freed)
	d.holds(t, loser, 1)
	deletePods(t, "default", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, loser, "dra-one")
	d.sliceUnchanged(t, "after the race")
}

// A tenant with NET_ADMIN in its pod sets its NIC's alias (where
// host-device keeps the host name, to rename the NIC on its way home) to
// the host name of the NIC another pod holds, and is deleted first: its
// NIC comes home under its own name, not the neighbour's, so the
// neighbour's NIC comes home too when that pod is deleted. Both DELs
// succeed at once (multus-shim's DEL exits 0 for each sandbox, never
// non-zero), and the host has exactly its devices of before.
func (d *draRig) aliasOfAnother(t *testing.T) {
	const tenant, victim = "dra-alias", "dra-victim"
	// The NICs dra-c does not hold are home before the host is counted:
	// the last step's pod is gone from the API before its NIC is back.
	held := d.holds(t, "dra-c", 2)
	var free []rig.NIC
	for _, n := range d.nics {
		if !slices.Contains(held, n) {
			free = append(free, n)
		}
	}
	waitNICsHome(t, free)
	before := hostDevices(t)
	createPod(t, draPod(victim, draOneTemplate, 1, 8))
	p := draPod(tenant, draOneTemplate, 1, 9)
	p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
	createPod(t, p)
	waitRunning(t, "default", victim, 4*time.Minute)
	waitRunning(t, "default", tenant, 4*time.Minute)
	vNIC := d.holds(t, victim, 1)[0]
	tNIC := d.holds(t, tenant, 1)[0]
	sandboxes := []string{sandboxOf(t, "default", tenant).Id, sandboxOf(t, "default", victim).Id}
	if _, stderr, err := execIn(t, "default", tenant, "tools", rig.IPTool, "link", "set", "dev", "net1", "alias", vNIC.Netdev); err != nil {
		t.Fatalf("%s: ip link set net1 alias %s: %v\n%s", tenant, vNIC.Netdev, err, stderr)
	}
	out, _, err := execIn(t, "default", tenant, "tools", "cat", "/sys/class/net/net1/ifalias")
	if err != nil || strings.TrimSpace(out) != vNIC.Netdev {
		t.Fatalf("%s: net1's alias is %q (%v), want %s", tenant, out, err, vNIC.Netdev)
	}
	t.Logf("%s set the alias of its NIC %s (%s) to %s, the host name of %s's NIC", tenant, tNIC.Netdev, tNIC.PCI, vNIC.Netdev, victim)
	deletePod(t, "default", tenant, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	waitNICsHome(t, []rig.NIC{tNIC})
	deletePod(t, "default", victim, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	waitNICsHome(t, []rig.NIC{tNIC, vNIC})
	waitHostAsBefore(t, before)
	for i, sb := range sandboxes {
		// The NIC is home once the plugins have run; the shim logs its
		// exit after the daemon's answer.
		var exits []string
		if err := cririg.Wait(time.Minute, "multus-shim's DEL of "+sb+" exited", func() (bool, error) {
			var err error
			exits, err = cririg.Exits("multus-shim", "DEL", sb)
			return len(exits) > 0, err
		}); err != nil {
			t.Error(err)
		}
		if slices.ContainsFunc(exits, func(e string) bool { return e != "rc=0" }) {
			t.Errorf("%s's sandbox %s: multus-shim DEL exits %v, want only rc=0", []string{tenant, victim}[i], sb, exits)
		}
	}
	d.sliceUnchanged(t, "after a tenant named its NIC after another's")
}

// The driver restarted (its pod deleted and replaced by its DaemonSet), then
// kubelet, under dra-c holding two claimed NICs: the pod keeps its
// sandbox, its NICs and its record, and the slice is unchanged; the
// restarted driver publishes the devices dra-c holds, which the host no
// longer shows. The record is the same file, byte for byte, and the new
// driver's log has no Prepare of the claim: kubelet did not ask again.
func (d *draRig) restarts(t *testing.T) {
	sb := sandboxOf(t, "default", "dra-c").Id
	before := d.holds(t, "dra-c", 2)
	rec := d.recordOf(t, "dra-c")
	old := d.waitDriver(true)
	if err := cs.CoreV1().Pods(dsNamespace).Delete(ctx(t), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := cririg.Wait(6*time.Minute, "a new driver pod Ready", func() (bool, error) {
		pods, done, _, err := driverPods(ctx(t), true, []string{node.Name})
		return err == nil && done && pods[node.Name].UID != old.UID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The slice as it was: the restarted driver publishes dra-c's NICs,
	// which the host no longer shows, from its inventory on disk.
	since := time.Now()
	d.waitSliceUnchanged(t)
	t.Logf("the driver restarted: its slice as before %s after its new pod was Ready", time.Since(since).Round(time.Second))
	if cpu, err := cluster.CPUTime(kubelet.Pid()); err == nil {
		stoppedKubeletCPU += cpu
	}
	kubelet.Stop()
	if kubelet, err = node.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := waitNode(4*time.Minute, true); err != nil {
		t.Fatal(err)
	}
	// kubelet removes the node's slices when it starts, until each driver
	// has registered again; the driver's slice controller then puts the
	// pool back.
	since = time.Now()
	d.waitSliceUnchanged(t)
	t.Logf("kubelet restarted: the driver's slice as before %s after the node was Ready", time.Since(since).Round(time.Second))
	if now := sandboxOf(t, "default", "dra-c").Id; now != sb {
		t.Errorf("dra-c's sandbox is %s after the restarts, was %s", now, sb)
	}
	p, err := cs.CoreV1().Pods("default").Get(ctx(t), "dra-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 || p.Status.Phase != corev1.PodRunning {
		t.Errorf("dra-c: phase %s, restart count %d after the restarts", p.Status.Phase, rc)
	}
	if after := d.holds(t, "dra-c", 2); !slices.Equal(after, before) {
		t.Errorf("dra-c holds %s after the restarts, held %s", nicsText(after), nicsText(before))
	}
	sameRecord(t, rec, "after the driver's and kubelet's restarts")
	noPrepareLogged(t, rec.ClaimUID, "after the driver's and kubelet's restarts")
}

// A claim with adminAccess, in a namespace allowed it, asking for a NIC
// dra-c holds: the scheduler gives it the NIC, ignoring dra-c's claim,
// but the driver's Prepare refuses it (a NIC moves into one pod's netns),
// so its pod gets the kubelet's FailedPrepareDynamicResources event
// naming adminAccess, no sandbox, no container and no record, and dra-c
// keeps its NICs.
func (d *draRig) adminAccessRefused(t *testing.T) {
	const ns, pod, claimName = "dra-admin", "dra-admin", "dra-admin-nic"
	held := d.holds(t, "dra-c", 2)
	c := ctx(t)
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"}}}
	if _, err := cs.CoreV1().Namespaces().Create(c, nsObj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "watch",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draDeviceClass,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           1,
				AdminAccess:     new(true),
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes["resource.kubernetes.io"].pciBusID == %q`, held[0].PCI),
				}}},
			},
		}}}},
	}
	created, err := cs.ResourceV1().ResourceClaims(ns).Create(c, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := toolsPod(ns, pod, "")
	delete(p.Annotations, "k8s.v1.cni.cncf.io/networks")
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "watch", ResourceClaimName: new(claimName)}}
	createPod(t, p)
	ev := waitEventReason(t, ns, pod, "FailedPrepareDynamicResources", "adminAccess")
	t.Logf("an admin-access claim on dra-c's NIC %s: %s: %s", held[0].Netdev, ev.Reason, ev.Message)
	startsNothing(t, ns, pod, "with its admin-access claim refused", true, nil)
	recordGone(t, string(created.UID))
	if after := d.holds(t, "dra-c", 2); !slices.Equal(after, held) {
		t.Errorf("dra-c holds %s after the admin-access claim, held %s", nicsText(after), nicsText(held))
	}
	deletePod(t, ns, pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err := cs.ResourceV1().ResourceClaims(ns).Delete(c, claimName, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	d.sliceUnchanged(t, "after the admin-access claim")
}

// rdma-netns, the attach, absent from the node (its binary moved away):
// a pod whose claim is allocated and prepared (its record on the node,
// naming the claim's NIC) gets no sandbox: kubelet's event says the
// sandbox failed for want of plugin rdma-netns, no container ever starts,
// and its NIC's netdev and RDMA device stay on the host; with the binary
// back it starts with its NIC. The chart's claims entry is in the node's
// primary network, so a plain pod (no claim, no network) fails alike, and
// the doctor says why; it starts too once the binary is back.
func (d *draRig) attachAbsent(t *testing.T) {
	const pod = "dra-noattach"
	aside := cniBinary + ".e2e-aside"
	if err := os.Rename(cniBinary, aside); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.Rename(aside, cniBinary); err != nil {
				t.Errorf("restore %s: %v", cniBinary, err)
			}
		}
	}
	t.Cleanup(restore)
	createPod(t, draPod(pod, draOneTemplate, 1, 7))
	const plain = "dra-plain"
	createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: plain, Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []corev1.Container{unprivilegedTools("tools", "3600")}}})
	missing := `failed to find plugin "rdma-netns"`
	ev := waitEventReason(t, "default", pod, "FailedCreatePodSandBox", missing)
	t.Logf("without the attach: %s: %s", ev.Reason, ev.Message)
	ev = waitEventReason(t, "default", plain, "FailedCreatePodSandBox", `network "cluster"`, missing)
	t.Logf("a plain pod without the attach (the claims entry in the primary network): %s: %s", ev.Reason, ev.Message)
	rep, _, err := doctorrun.JSON(aside)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(rep.Findings, func(f doctor.Finding) bool { return f.Check == "claims-entry" }); i < 0 || rep.Findings[i].Severity != doctor.Fail ||
		!strings.Contains(rep.Findings[i].Reason, "every pod sandbox on this node fails") {
		t.Errorf("the doctor's claims-entry finding without the binary: %+v", rep.Findings)
	} else {
		t.Logf("doctor: %s %s: %s", rep.Findings[i].Severity, rep.Findings[i].Check, rep.Findings[i].Reason)
	}
	claim, nics := d.claimNICs(t, pod)
	d.recordNames(t, pod, claim, nics)
	startsNothing(t, "default", pod, "without rdma-netns on the node", false, nics)
	restore()
	back := time.Now()
	waitRunning(t, "default", pod, 5*time.Minute)
	waitRunning(t, "default", plain, 5*time.Minute)
	deletePod(t, "default", plain, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	t.Logf("%s Running %s after the binary was back:\n%s", pod, time.Since(back).Round(time.Second), eventTimeline(t, "default", pod, back.Add(-time.Minute)))
	d.holds(t, pod, 1)
	deletePod(t, "default", pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	waitNICsHome(t, nics)
}

// refusedWindow is how long a refused pod is watched starting nothing.
const refusedWindow = 10 * time.Second

// startsNothing watches the refused pod for refusedWindow: it stays
// Pending with no container ever started, with no sandbox of its UID
// when noSandbox (a pod refused at its claim's Prepare; the one refused
// at its sandbox's network has one come and go at each retry), and with
// nics, its claim's NICs, on the host.
func startsNothing(t *testing.T, ns, pod, why string, noSandbox bool, nics []rig.NIC) {
	t.Helper()
	refuse(t, ns, refusedPod{name: pod, why: why, noSandbox: noSandbox, nics: nics})
}

// refusedPod is a pod that must start nothing: why it is refused, whether
// it must have no sandbox, and its claim's NICs.
type refusedPod struct {
	name, why string
	noSandbox bool
	nics      []rig.NIC
}

// refuse watches the pods together for refusedWindow, as startsNothing
// watches one.
func refuse(t *testing.T, ns string, pods ...refusedPod) {
	t.Helper()
	for end := time.Now().Add(refusedWindow); ; time.Sleep(2 * time.Second) {
		for _, r := range pods {
			p, err := cs.CoreV1().Pods(ns).Get(ctx(t), r.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := noContainerStarted(p); err != nil {
				t.Fatalf("%s %s: %v", r.name, r.why, err)
			}
			if r.noSandbox {
				if n := sandboxesLabelled(t, map[string]string{"io.kubernetes.pod.uid": string(p.UID)}); n != 0 {
					t.Fatalf("%s %s: %d sandboxes, want none: its claim was not prepared", r.name, r.why, n)
				}
			}
			if away, err := rig.Missing(r.nics); err != nil || len(away) > 0 {
				t.Fatalf("%s %s: its NIC left the host: %v %v", r.name, r.why, away, err)
			}
		}
		if time.Now().After(end) {
			return
		}
	}
}

// noContainerStarted says what shows that a container of the pod ran:
// the pod Running, or a container's state, last state or restart count.
func noContainerStarted(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodPending {
		return fmt.Errorf("phase %s", p.Status.Phase)
	}
	for _, c := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if c.State.Running != nil || c.State.Terminated != nil || c.LastTerminationState.Terminated != nil || c.RestartCount != 0 || c.Started != nil && *c.Started {
			return fmt.Errorf("container %s started: state %+v, last %+v, restarts %d", c.Name, c.State, c.LastTerminationState, c.RestartCount)
		}
	}
	return nil
}

// waitEventReason waits for an event of the object with that reason whose
// message holds every one of want, and returns it.
func waitEventReason(t *testing.T, ns, name, reason string, want ...string) corev1.Event {
	t.Helper()
	var found corev1.Event
	err := cririg.Wait(2*time.Minute, fmt.Sprintf("a %s event of %s/%s saying %s", reason, ns, name, strings.Join(want, ", ")), func() (bool, error) {
		list, err := cs.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(e.Message, w) }) {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, events(t, ns, name))
	}
	return found
}

// The driver absent: first gone after a pod was placed
// (driverGoneAfterScheduling), then the chart back at its default
// (dra.enabled=false) while dra-c holds two NICs: kubelet unpublishes the
// driver's slice, a pod asking a NIC waits unscheduled with no sandbox,
// dra-c keeps its NICs; with the driver back, the slice is as it was
// (dra-c's NICs published though the host cannot see them) and both pods
// run.
func (d *draRig) driverAbsent(t *testing.T) {
	const pod = "dra-nodriver"
	placed := d.driverGoneAfterScheduling(t)
	removeChartDRA(t)
	d.waitDriver(false)
	if err := cririg.Wait(2*time.Minute, "the driver's slice gone", func() (bool, error) {
		devs, err := d.sliceDevices()
		return err == nil && len(devs) == 0, err
	}); err != nil {
		t.Fatal(err)
	}
	createPod(t, draPod(pod, draOneTemplate, 1, 8))
	msg := waitPending(t, pod, pendingSettle)
	t.Logf("without the driver: %s", msg)
	d.holds(t, "dra-c", 2)
	d.enable()
	d.slice = d.waitSliceUnchanged(t)
	back := time.Now()
	waitRunning(t, "default", pod, 5*time.Minute)
	t.Logf("%s Running %s after the slice was back:\n%s", pod, time.Since(back).Round(time.Second), eventTimeline(t, "default", pod, back))
	d.holds(t, pod, 1)
	waitRunning(t, "default", placed, 5*time.Minute)
	t.Logf("%s Running %s after the slice was back", placed, time.Since(back).Round(time.Second))
	d.holds(t, placed, 1)
	deletePods(t, "default", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, pod, placed)
}

// driverGoneAfterScheduling: the driver's DaemonSet deleted alone, its
// pod gone, so the kubelet has no driver to prepare a claim with, but it
// keeps the driver's slice for its wiping delay (30 s), and the
// scheduler still allocates from it. A pod asking one NIC in that window
// is placed with its claim allocated and gets the kubelet's
// FailedPrepareDynamicResources saying the driver is not registered; its
// claim is not prepared (no record), it gets no sandbox, no container
// starts, and its NIC stays on the host. It returns the pod, which runs
// once the driver is back (driverAbsent).
func (d *draRig) driverGoneAfterScheduling(t *testing.T) string {
	const pod = "dra-driverless"
	if err := cs.AppsV1().DaemonSets(dsNamespace).Delete(ctx(t), draDSName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cririg.Wait(2*time.Minute, "the driver's pod gone", func() (bool, error) {
		_, done, _, err := driverPods(ctx(t), false, []string{node.Name})
		return done, err
	}); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	createPod(t, draPod(pod, draOneTemplate, 1, 9))
	if err := cririg.Wait(20*time.Second, "the pod placed on the slice the kubelet keeps 30 s after the driver left", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx(t), pod, metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", err
	}); err != nil {
		t.Fatalf("%v (the driver left %s ago): the scheduler was too slow for the kubelet's wiping delay\nevents:\n%s", err, time.Since(gone).Round(time.Second), events(t, "default", pod))
	}
	ev := waitEventReason(t, "default", pod, "FailedPrepareDynamicResources", draDriver, "is not registered")
	t.Logf("driver gone after scheduling: %s: %s", ev.Reason, ev.Message)
	claim, nics := d.claimNICs(t, pod)
	startsNothing(t, "default", pod, "without the driver", true, nics)
	recordGone(t, d.claimUID(t, claim))
	return pod
}

// waitSliceUnchanged waits for the driver's slice to be back as it was.
func (d *draRig) waitSliceUnchanged(t *testing.T) map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	var now map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	err := cririg.Wait(3*time.Minute, "the driver's slice back as it was", func() (bool, error) {
		var err error
		now, err = d.sliceDevices()
		return err == nil && reflect.DeepEqual(now, d.slice), err
	})
	if err != nil {
		t.Fatalf("%v:\nnow    %s\nbefore %s", err, attrsText(now), attrsText(d.slice))
	}
	return now
}

// Every pod deleted: every NIC and RDMA device home under its own name,
// the host's netdevs and RDMA devices exactly those it had before the
// first pod, no claim record left on the node, the slice as it was.
func (d *draRig) allHome(t *testing.T) {
	deletePod(t, "default", "dra-c", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	waitNICsHome(t, d.nics)
	waitHostAsBefore(t, d.host)
	waitNoClaimRecords(t)
	d.sliceUnchanged(t, "every pod deleted")
}

// hostAtRest is hostDevices once every test NIC of the node is home: a
// pod of the test before may be gone from the API before its NIC is back.
func hostAtRest(t *testing.T) []string {
	t.Helper()
	all, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	waitNICsHome(t, all)
	return hostDevices(t)
}

// hostDevices is every netdev and RDMA device of the host's netns, as
// "netdev:NAME" and "rdma:NAME", sorted, but the host ends of the
// cluster network's veth pairs: the bridge plugin makes and removes one
// with every pod of any test, on the kubelet's time.
func hostDevices(t *testing.T) []string {
	t.Helper()
	links, err := rig.NetdevsIn("")
	if err != nil {
		t.Fatal(err)
	}
	devs, err := rig.RDMAIn("")
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, l := range links {
		if !strings.HasPrefix(l, "veth") {
			all = append(all, "netdev:"+l)
		}
	}
	for _, r := range devs {
		all = append(all, "rdma:"+r)
	}
	sort.Strings(all)
	return all
}

// waitHostAsBefore waits for the host's netdevs and RDMA devices to be
// exactly before: none missing, none renamed, none added.
func waitHostAsBefore(t *testing.T, before []string) {
	t.Helper()
	var now []string
	if err := cririg.Wait(time.Minute, "the host's netdevs and RDMA devices as before", func() (bool, error) {
		now = hostDevices(t)
		return slices.Equal(now, before), nil
	}); err != nil {
		var gone, added []string
		for _, x := range before {
			if !slices.Contains(now, x) {
				gone = append(gone, x)
			}
		}
		for _, x := range now {
			if !slices.Contains(before, x) {
				added = append(added, x)
			}
		}
		t.Fatalf("%v: missing %v, not there before %v", err, gone, added)
	}
}

// waitNICsHome waits for every NIC and its RDMA device to be on the host
// under its own name. The API server forgets a pod before kubelet has
// torn its sandbox down: the NICs come home with the CNI DEL, RDMA device
// first.
func waitNICsHome(t *testing.T, nics []rig.NIC) {
	t.Helper()
	var away []string
	if err := cririg.Wait(time.Minute, nicSpan(nics)+" and their RDMA devices home", func() (bool, error) {
		var err error
		away, err = rig.Missing(nics)
		return len(away) == 0 && err == nil, err
	}); err != nil {
		t.Fatalf("%v; still away: %v", err, away)
	}
}

// waitNoClaimRecords waits for the node's record directory to hold no
// claim record, damaged or whole, and fails t with what it holds if it
// does not come to that. The directory itself must be there: a driver
// that wrote its records elsewhere would leave it empty too.
func waitNoClaimRecords(t *testing.T) {
	t.Helper()
	var claims []*drarecord.Claim
	var bad, specs []string
	// Unprepare removes the claim's CDI specs too: the NICs' right after
	// its record, the device metadata's (the kubelet plugin helper's) once
	// the driver has answered.
	if err := cririg.Wait(time.Minute, "no DRA claim record and no CDI spec of the driver on the node", func() (bool, error) {
		st, err := os.Stat(draRecordDir)
		if err != nil || !st.IsDir() {
			return false, fmt.Errorf("the record directory %s: %v", draRecordDir, err)
		}
		claims, bad, err = drarecord.Dir(draRecordDir).List()
		specs, _ = filepath.Glob(filepath.Join(cdi.DefaultDir, drarecord.DriverName+"_*"))
		return err == nil && len(claims) == 0 && len(bad) == 0 && len(specs) == 0, err
	}); err != nil {
		out, _ := exec.Command("ls", "-l", draRecordDir).CombinedOutput()
		t.Errorf("%v: %d records, damaged %v, CDI specs %v:\n%s", err, len(claims), bad, specs, out)
	}
}

// The node's reboot with a pod holding claimed NICs (TestReboot): the
// first boot leaves a Deployment whose pod holds two NICs from conf's
// template, with the driver on (the chart with dra.enabled); after the
// reboot kubelet brings the same pod back without preparing its claim
// again, the new sandbox gets both NICs from the driver's record on the
// node's disk, the driver publishes the same devices, and once the pod is
// gone no claim record is left.
const (
	rebootDRANotes      = "/mnt/disk/e2e-reboot-dra.json"
	rebootDRADeployment = "reboot-dra"
)

// rebootDRA is what the first boot tells the second about the DRA pod.
type rebootDRA struct {
	Pod, UID, Sandbox, Claim string
	Devices                  []string
	Slice                    map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	// Record is the claim's record file at power-off.
	Record recordFile
}

// draRebootNICs are the reboot's DRA NICs: not eth1 and eth2, which the
// RuntimeClass pods of TestReboot hold.
var draRebootNICs = []string{"eth3", "eth4"}

func draBeforeReboot(t *testing.T) {
	d := &draRig{t: t}
	for _, n := range draRebootNICs {
		d.nics = append(d.nics, nicNamed(t, n))
	}
	d.enable()
	for _, m := range []string{"dra-deviceclass", "dra-claimtemplate", "nad-dra"} {
		applyManifest(t, m)
	}
	d.slice = d.waitSlice(len(d.nics))
	pod := draPod("", draTemplate2, 2, 9)
	labels := map[string]string{"app": rebootDRADeployment}
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: rebootDRADeployment, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: pod.Annotations}, Spec: pod.Spec},
		},
	}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx(t), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitDeploymentPod(t, rebootDRADeployment, time.Time{})
	nics := d.holds(t, p.Name, 2)
	claim, _ := d.claimNICs(t, p.Name)
	n := rebootDRA{Pod: p.Name, UID: string(p.UID), Sandbox: sandboxOf(t, "default", p.Name).Id, Claim: claim, Slice: d.slice,
		Record: d.recordOf(t, p.Name)}
	for _, nic := range nics {
		n.Devices = append(n.Devices, nic.RDMA)
	}
	data, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rebootDRANotes, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("powering off with DRA pod %s (%s), claim %s, devices %v", n.Pod, n.UID, n.Claim, n.Devices)
}

// draAfterReboot checks the DRA pod on the second boot and returns the
// RDMA devices it holds.
func draAfterReboot(t *testing.T) []string {
	data, err := os.ReadFile(rebootDRANotes)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var n rebootDRA
	if err := json.Unmarshal(data, &n); err != nil {
		t.Fatalf("%s: %v", rebootDRANotes, err)
	}
	d := &draRig{t: t, slice: n.Slice}
	for _, name := range draRebootNICs {
		d.nics = append(d.nics, nicNamed(t, name))
	}
	p := waitDeploymentPod(t, rebootDRADeployment, kubelet.Started)
	if p.Name != n.Pod || string(p.UID) != n.UID {
		t.Errorf("Deployment %s: pod %s (%s) after the reboot, was %s (%s)", rebootDRADeployment, p.Name, p.UID, n.Pod, n.UID)
	}
	if sb := sandboxOf(t, "default", p.Name).Id; sb == n.Sandbox {
		t.Errorf("pod %s: sandbox %s is the one from before the reboot", p.Name, sb)
	}
	claim, _ := d.claimNICs(t, p.Name)
	if claim != n.Claim {
		t.Errorf("pod %s: claim %s after the reboot, was %s", p.Name, claim, n.Claim)
	}
	nics := d.holds(t, p.Name, 2)
	var devs []string
	for _, nic := range nics {
		devs = append(devs, nic.RDMA)
	}
	if !slices.Equal(devs, n.Devices) {
		t.Errorf("pod %s holds %v after the reboot, held %v", p.Name, devs, n.Devices)
	}
	d.waitSliceUnchanged(t)
	claims, bad, err := drarecord.Dir(draRecordDir).List()
	if err != nil || len(claims) != 1 || claims[0].PodUID != n.UID || len(bad) > 0 {
		t.Errorf("DRA records after the reboot: %+v, damaged %v (%v), want the one of pod %s", claims, bad, err, n.UID)
	}
	// The new sandbox's NICs came from the record written before the
	// reset: the kubelet asks the driver again after the reboot, and the
	// driver answers from that record, the same file.
	sameRecord(t, n.Record, "after the reboot")
	onlyRecordAnswered(t, n.Record.ClaimUID, "after the reboot")
	return devs
}

// draAfterRebootGone checks, once the DRA pod's Deployment is scaled to
// 0, that its NICs are home and no claim record is left.
func draAfterRebootGone(t *testing.T, devs []string) {
	if len(devs) == 0 {
		return
	}
	scale(t, rebootDRADeployment, 0)
	if err := cririg.Wait(2*time.Minute, "the pods of "+rebootDRADeployment+" gone", func() (bool, error) {
		return len(podsOf(t, rebootDRADeployment)) == 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, dev := range devs {
		waitHome(t, dev)
	}
	waitNoClaimRecords(t)
}

// netDiag is what the pod's netns shows of its addresses, neighbours,
// routes and ARP settings, for a failed traffic run's message.
func netDiag(t *testing.T, pod string) string { return netDiagOf(t, pod, "net*") }

// netDiagOf is netDiag with the ARP settings of the interfaces that
// match glob.
func netDiagOf(t *testing.T, pod, glob string) string {
	t.Helper()
	netns := mustNetns(t, "default", pod)
	out, err := exec.Command("nsenter", "--net="+netns, "sh", "-c",
		`ip=`+rig.IPTool+`; $ip -br addr; $ip neigh; $ip route; for c in /proc/sys/net/ipv4/conf/`+glob+`; do echo "${c##*/} arp_ignore $(cat $c/arp_ignore) arp_announce $(cat $c/arp_announce)"; done`).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%v: %s", err, out)
	}
	return string(out)
}
