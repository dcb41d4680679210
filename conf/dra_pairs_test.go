package conf

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
)

// gpuDeviceClass is the DeviceClass NVIDIA's GPU DRA driver installs; the
// pairs template asks for it, conf/ does not define it.
const gpuDeviceClass = "gpu.nvidia.com"

// pcieRootAttribute is the standard attribute both drivers publish: the
// PCIe root a device sits under.
const pcieRootAttribute = "resource.kubernetes.io/pcieRoot"

// outsideClasses are DeviceClasses a template of conf/ may ask for that
// another driver's installation creates, with that driver.
var outsideClasses = map[string]string{
	gpuDeviceClass: "NVIDIA's GPU DRA driver",
}

// checkPairs: every constraint names requests the template makes, and
// each GPU request gets its NIC under its PCIe root: one pcieRoot
// constraint binding it, of exactly one device, to the NIC request of its
// number (gpu<k> with nic<k>), of exactly one device too. A constraint
// binds every device of its requests, so a wider one would put more than
// one pair under a single root, and none would leave the GPU's NIC to
// chance.
func checkPairs(tpl *resourcev1.ResourceClaimTemplate) error {
	devs := tpl.Spec.Spec.Devices
	reqs := map[string]*resourcev1.ExactDeviceRequest{}
	for _, r := range devs.Requests {
		reqs[r.Name] = r.Exactly
	}
	for i, c := range devs.Constraints {
		for _, name := range c.Requests {
			if _, ok := reqs[name]; !ok {
				return fmt.Errorf("constraint %d names request %q, which the template does not make", i, name)
			}
		}
	}
	for _, r := range devs.Requests {
		if r.Exactly == nil || r.Exactly.DeviceClassName != gpuDeviceClass {
			continue
		}
		if err := checkPair(r.Name, reqs, devs.Constraints); err != nil {
			return err
		}
	}
	return nil
}

func checkPair(gpu string, reqs map[string]*resourcev1.ExactDeviceRequest, constraints []resourcev1.DeviceConstraint) error {
	if n := exactCount(reqs[gpu]); n != 1 {
		return fmt.Errorf("request %s asks for %d GPUs (0: All): a pcieRoot constraint on it would put them all, with their NICs, under one root; make a request pair per GPU", gpu, n)
	}
	k, ok := strings.CutPrefix(gpu, "gpu")
	if !ok || k == "" {
		return fmt.Errorf("GPU request %s: name it gpu<k>, so that its NIC is nic<k>, the request nad-dra-rails.yaml's rdma-dra-rail<k> attaches", gpu)
	}
	nic := "nic" + k
	var found []int
	for i, c := range constraints {
		if c.MatchAttribute != nil && string(*c.MatchAttribute) == pcieRootAttribute && slices.Contains(c.Requests, gpu) {
			found = append(found, i)
		}
	}
	if len(found) != 1 {
		return fmt.Errorf("request %s is in %d constraints with matchAttribute %s, want 1 with %s: without it the GPU's NIC may be under another root, and GPUDirect RDMA goes through the CPU", gpu, len(found), pcieRootAttribute, nic)
	}
	c := constraints[found[0]]
	if !slices.Equal(slices.Sorted(slices.Values(c.Requests)), []string{gpu, nic}) {
		return fmt.Errorf("constraint %d binds %v, want exactly [%s %s]: one GPU and its NIC per root", found[0], c.Requests, gpu, nic)
	}
	if r := reqs[nic]; r == nil {
		return fmt.Errorf("request %s is not an exact request: want one NIC of %s", nic, draDeviceClass)
	} else if r.DeviceClassName != draDeviceClass || exactCount(r) != 1 {
		return fmt.Errorf("request %s: DeviceClass %s, %d devices; want one NIC of %s", nic, r.DeviceClassName, exactCount(r), draDeviceClass)
	}
	return nil
}

// claimsNamed: a claim with requests for another driver's devices (GPUs)
// is named by a container, the only way its devices (CDI) reach one.
func claimsNamed(pod *corev1.Pod, reqs podRequests) error {
	for claim, names := range reqs.outside {
		for _, req := range names {
			named := false
			for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
				named = named || slices.ContainsFunc(c.Resources.Claims, func(rc corev1.ResourceClaim) bool {
					return rc.Name == claim && (rc.Request == "" || rc.Request == req)
				})
			}
			if !named {
				return fmt.Errorf("resourceClaims %s asks for %s devices (request %s), but no container names it in resources.claims: no container gets them", claim, reqs.others[req], req)
			}
		}
	}
	return nil
}

// rdmaDevNameOf is the rdmaDevName of a NAD's rdma-netns entry.
func rdmaDevNameOf(nad *networkAttachmentDefinition) string {
	list, err := libcni.NetworkConfFromBytes([]byte(nad.Spec.Config))
	if err != nil {
		return ""
	}
	for _, p := range list.Plugins {
		var e struct {
			RdmaDevName string `json:"rdmaDevName"`
		}
		if p.Network.Type == "rdma-netns" && json.Unmarshal(p.Bytes, &e) == nil {
			return e.RdmaDevName
		}
	}
	return ""
}

// checkDRATuning: a tuning entry in a DRA network sets the ARP sysctls
// that keep each of a pod's addresses on its own NIC, for whatever
// attachment name (checked on net2, a pod's second NIC).
func checkDRATuning(nad *networkAttachmentDefinition) error {
	list, err := libcni.NetworkConfFromBytes([]byte(nad.Spec.Config))
	if err != nil {
		return nil // checkChain reports it
	}
	for _, p := range list.Plugins {
		if p.Network.Type == "tuning" {
			if err := checkARPTuning(p.Bytes, "net2"); err != nil {
				return err
			}
		}
	}
	return nil
}

func pairsTemplate(t *testing.T) *resourcev1.ResourceClaimTemplate {
	t.Helper()
	return templateIn(t, "dra-claimtemplate-pairs.yaml")
}

// templateIn is the one ResourceClaimTemplate of a file of conf/.
func templateIn(t *testing.T, file string) *resourcev1.ResourceClaimTemplate {
	t.Helper()
	objs := mustDecodeFile(t, file)
	tpl, ok := objs[0].obj.(*resourcev1.ResourceClaimTemplate)
	if len(objs) != 1 || !ok {
		t.Fatalf("%s: want one ResourceClaimTemplate, got %d objects", file, len(objs))
	}
	return tpl
}

// The pairs template gives each of its four GPUs a NIC under its root,
// and checkPairs refuses each way of losing that.
func TestGPUNICPairs(t *testing.T) {
	base := pairsTemplate(t)
	if base.Name != "gpu-nic-pairs-4" {
		t.Errorf("template %s, the docs name gpu-nic-pairs-4", base.Name)
	}
	var gpus, nics []string
	for _, r := range base.Spec.Spec.Devices.Requests {
		switch r.Exactly.DeviceClassName {
		case gpuDeviceClass:
			gpus = append(gpus, r.Name)
		case draDeviceClass:
			nics = append(nics, r.Name)
		}
	}
	if !slices.Equal(gpus, []string{"gpu0", "gpu1", "gpu2", "gpu3"}) || !slices.Equal(nics, []string{"nic0", "nic1", "nic2", "nic3"}) {
		t.Errorf("requests: GPUs %v, NICs %v; want gpu0..gpu3 and nic0..nic3", gpus, nics)
	}
	root := resourcev1.FullyQualifiedName(pcieRootAttribute)
	numa := resourcev1.FullyQualifiedName("resource.kubernetes.io/numaNode")
	for _, tc := range []struct {
		name   string
		change func(*resourcev1.DeviceClaim)
		want   string
	}{
		{"valid baseline", func(*resourcev1.DeviceClaim) {}, ""},
		{"a pair's constraint removed", func(d *resourcev1.DeviceClaim) {
			d.Constraints = slices.Delete(d.Constraints, 2, 3)
		}, "request gpu2 is in 0 constraints"},
		{"numaNode in place of pcieRoot", func(d *resourcev1.DeviceClaim) { d.Constraints[1].MatchAttribute = &numa }, "request gpu1 is in 0 constraints"},
		{"pairs crossed", func(d *resourcev1.DeviceClaim) {
			d.Constraints[0].Requests = []string{"gpu0", "nic1"}
			d.Constraints[1].Requests = []string{"gpu1", "nic0"}
		}, "want exactly [gpu0 nic0]"},
		{"two pairs under one root", func(d *resourcev1.DeviceClaim) {
			d.Constraints[0].Requests = []string{"gpu0", "nic0", "gpu1", "nic1"}
			d.Constraints = slices.Delete(d.Constraints, 1, 2)
		}, "want exactly [gpu0 nic0]"},
		{"one request of four GPUs", func(d *resourcev1.DeviceClaim) {
			d.Requests[0].Exactly.AllocationMode = resourcev1.DeviceAllocationModeExactCount
			d.Requests[0].Exactly.Count = 4
		}, "asks for 4 GPUs"},
		{"all GPUs", func(d *resourcev1.DeviceClaim) {
			d.Requests[0].Exactly.AllocationMode = resourcev1.DeviceAllocationModeAll
		}, "asks for 0 GPUs"},
		{"two NICs for a GPU", func(d *resourcev1.DeviceClaim) {
			d.Requests[7].Exactly.AllocationMode = resourcev1.DeviceAllocationModeExactCount
			d.Requests[7].Exactly.Count = 2
		}, "request nic3: DeviceClass rdma-nic.rdma-netns.io, 2 devices"},
		{"constraint names a request not made", func(d *resourcev1.DeviceClaim) {
			d.Constraints = append(d.Constraints, resourcev1.DeviceConstraint{Requests: []string{"gpu0", "nic9"}, MatchAttribute: &root})
		}, `names request "nic9"`},
		{"NIC request with alternatives", func(d *resourcev1.DeviceClaim) {
			d.Requests[4].FirstAvailable = []resourcev1.DeviceSubRequest{{Name: "a", DeviceClassName: draDeviceClass}}
			d.Requests[4].Exactly = nil
		}, "request nic0 is not an exact request"},
		{"pair's constraint twice", func(d *resourcev1.DeviceClaim) {
			d.Constraints = append(d.Constraints, d.Constraints[3])
		}, "request gpu3 is in 2 constraints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl := base.DeepCopy()
			tc.change(&tpl.Spec.Spec.Devices)
			wantRejection(t, "valid template", checkPairs(tpl), tc.want)
		})
	}
}

// The pod of the pairs example attaches nic<k> as rdma_r<k> for every
// pair, in order, and lists exactly those devices for NCCL and UCX.
func TestDRAPairsPod(t *testing.T) {
	var d draExamples
	for _, f := range []string{"dra-deviceclass.yaml", "dra-claimtemplate-pairs.yaml", "nad-dra-rails.yaml", "pod-dra-pairs.yaml"} {
		for _, o := range mustDecodeFile(t, f) {
			d.add(o)
		}
	}
	for _, err := range d.check() {
		t.Error(err)
	}
	pod := loadPod(t, "pod-dra-pairs.yaml")
	var sel []draAttachment
	if err := json.Unmarshal([]byte(pod.Annotations["k8s.v1.cni.cncf.io/networks"]), &sel); err != nil {
		t.Fatal(err)
	}
	pairs := 0
	for _, r := range pairsTemplate(t).Spec.Spec.Devices.Requests {
		if r.Exactly.DeviceClassName == draDeviceClass {
			pairs++
		}
	}
	if len(sel) != pairs {
		t.Errorf("the pod attaches %d networks, the template has %d NICs", len(sel), pairs)
	}
	var devs []string
	for k, a := range sel {
		nad := d.nads[a.Name]
		if nad == nil {
			t.Fatalf("network %s: no NAD with \"dra\" of that name", a.Name)
		}
		dra := draOf(nad)
		if dra.Request == nil || *dra.Request != "nic"+strconv.Itoa(k) || dra.Index != nil || len(a.CNIArgs) > 0 {
			t.Errorf("attachment %d (%s): dra %+v, cni-args %v; want request nic%d, no index, no cni-args", k, a.Name, dra, a.CNIArgs, k)
		}
		if got, want := rdmaDevNameOf(nad), "rdma_r"+strconv.Itoa(k); got != want {
			t.Errorf("attachment %d (%s): rdmaDevName %q, want %s", k, a.Name, got, want)
		}
		if len(a.IPs) != 1 {
			t.Errorf("attachment %d (%s): ips %v, want one address (static IPAM)", k, a.Name, a.IPs)
		}
		devs = append(devs, rdmaDevNameOf(nad)+":1")
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if want := "=" + strings.Join(devs, ","); env["NCCL_IB_HCA"] != want {
		t.Errorf("NCCL_IB_HCA %q, want %q", env["NCCL_IB_HCA"], want)
	}
	if want := strings.Join(devs, ","); env["UCX_NET_DEVICES"] != want {
		t.Errorf("UCX_NET_DEVICES %q, want %q", env["UCX_NET_DEVICES"], want)
	}
	for _, v := range []string{"UCX_MAX_EAGER_RAILS", "UCX_MAX_RNDV_RAILS"} {
		if env[v] != strconv.Itoa(len(devs)) {
			t.Errorf("%s %q, want %d: every pair's NIC", v, env[v], len(devs))
		}
	}
	if ifname := strings.TrimPrefix(env["NCCL_SOCKET_IFNAME"], "="); !slices.ContainsFunc(sel, func(a draAttachment) bool { return a.Interface == ifname }) {
		t.Errorf("NCCL_SOCKET_IFNAME %q is none of the pod's attachments", env["NCCL_SOCKET_IFNAME"])
	}
	if _, ok := pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; ok {
		t.Error("the pod also asks the device plugin for GPUs: those are paired with no NIC")
	}
}

// checkPod refuses a pod whose GPUs would reach no container, an
// attachment that takes a GPU request for a NIC, and two attachments
// renaming their devices alike.
func TestDRAPairsPodRejects(t *testing.T) {
	nad := func(name, request, devName string) *networkAttachmentDefinition {
		n := &networkAttachmentDefinition{}
		n.Name = name
		n.Spec.Config = `{"cniVersion": "1.0.0", "name": "` + name + `", "plugins": [{"type": "rdma-netns", "dra": {"request": "` + request + `"}, "rdmaDevName": "` + devName + `", "capabilities": {"ips": true}, "ipam": {"type": "static"}}]}`
		return n
	}
	const two = `[{"name": "a", "interface": "net1"}, {"name": "b", "interface": "net2"}]`
	for _, tc := range []struct {
		name   string
		nads   []*networkAttachmentDefinition
		claims []corev1.ResourceClaim
		want   string
	}{
		{"valid baseline", []*networkAttachmentDefinition{nad("a", "nic0", "rdma_r0"), nad("b", "nic1", "rdma_r1")}, []corev1.ResourceClaim{{Name: "pairs"}}, ""},
		{"container names the NIC request only", []*networkAttachmentDefinition{nad("a", "nic0", "rdma_r0"), nad("b", "nic1", "rdma_r1")}, []corev1.ResourceClaim{{Name: "pairs", Request: "nic0"}}, "no container names it"},
		{"no container names the claim", []*networkAttachmentDefinition{nad("a", "nic0", "rdma_r0"), nad("b", "nic1", "rdma_r1")}, nil, "no container names it"},
		{"a GPU request as a NIC", []*networkAttachmentDefinition{nad("a", "gpu0", "rdma_r0"), nad("b", "nic1", "rdma_r1")}, []corev1.ResourceClaim{{Name: "pairs"}}, `request "gpu0" asks for DeviceClass gpu.nvidia.com`},
		{"one device name twice", []*networkAttachmentDefinition{nad("a", "nic0", "rdma_r0"), nad("b", "nic1", "rdma_r0")}, []corev1.ResourceClaim{{Name: "pairs"}}, "both name their RDMA device rdma_r0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl := pairsTemplate(t)
			pod := &corev1.Pod{}
			pod.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": two}
			pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "pairs", ResourceClaimTemplateName: &tpl.Name}}
			pod.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Claims: tc.claims}}}
			var d draExamples
			d.add(object{obj: tpl})
			for _, n := range tc.nads {
				d.add(object{obj: n})
			}
			wantRejection(t, "valid pod", d.checkPod(pod), tc.want)
		})
	}
}
