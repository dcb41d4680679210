package conf

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/draconfig"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// draDeviceClass is the DeviceClass name the contract of issue 57 fixes:
// docs and examples name it.
const draDeviceClass = "rdma-nic.rdma-netns.io"

// draNetConf mirrors the "dra" object of an rdma-netns entry as the
// contract of issue 57 has it, for as long as config.NetConf does not
// know the key (the CNI side of the issue adds it). It has no recordDir:
// the records are read from the node's directory alone and ADD refuses a
// NAD naming another, so an example that sets it fails the strict decode.
type draNetConf struct {
	Request *string `json:"request,omitempty"`
	Index   *int    `json:"index,omitempty"`
}

// draIPAM is what rdma-netns needs of the "ipam" it hands host-device.
type draIPAM struct {
	Type string `json:"type"`
}

// isDRA: the rdma-netns entry attaches a NIC the pod got by DRA.
func isDRA(entry []byte) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(entry, &m) == nil && m["dra"] != nil
}

// netConfKnows: config.NetConf has a field for JSON key key.
func netConfKnows(key string) bool {
	t := reflect.TypeFor[config.NetConf]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name == key {
			return true
		}
	}
	return false
}

// checkDRAChain: in DRA mode rdma-netns delegates to host-device itself,
// so it comes first and no plugin before or beside it moves a NIC.
func checkDRAChain(i int, list *libcni.NetworkConfigList) error {
	if i != 0 {
		return fmt.Errorf("rdma-netns with \"dra\" is plugin %d: it must come first, it moves the NIC itself (host-device) and the plugins before it would have nothing to work on", i)
	}
	for _, p := range list.Plugins {
		if p.Network.Type == "host-device" || p.Network.Type == "sriov" {
			return fmt.Errorf("the chain also runs %s: rdma-netns with \"dra\" has host-device move the pod's NIC, a second mover finds none (or another)", p.Network.Type)
		}
	}
	return nil
}

// draEntry decodes an rdma-netns entry with "dra" strictly: into
// config.NetConf, the keys it does not know yet ("dra", "ipam") into
// their mirrors.
func draEntry(raw []byte) (draNetConf, draIPAM, error) {
	var d draNetConf
	var ipam draIPAM
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return d, ipam, err
	}
	if err := strictInto(m["dra"], &d); err != nil {
		return d, ipam, fmt.Errorf("dra: %w", err)
	}
	if m["ipam"] == nil {
		return d, ipam, errors.New("no \"ipam\": host-device, which rdma-netns runs with it, would give the NIC no address")
	}
	if err := json.Unmarshal(m["ipam"], &ipam); err != nil || ipam.Type == "" {
		return d, ipam, fmt.Errorf("ipam %s has no type", m["ipam"])
	}
	for _, k := range []string{"dra", "ipam"} {
		if !netConfKnows(k) {
			delete(m, k)
		}
	}
	rest, err := json.Marshal(m)
	if err != nil {
		return d, ipam, err
	}
	if err := strictInto(rest, &config.NetConf{}); err != nil {
		return d, ipam, fmt.Errorf("unknown or mistyped field: %w", err)
	}
	return d, ipam, nil
}

// checkDRAEntry checks an rdma-netns entry with "dra" as the plugin gets
// it: first in the chain, so with no prevResult.
func checkDRAEntry(p *libcni.PluginConfig, list *libcni.NetworkConfigList) error {
	if _, _, err := draEntry(p.Bytes); err != nil {
		return err
	}
	for c, on := range p.Network.Capabilities {
		// ips reaches the IPAM that host-device runs for rdma-netns.
		if on && c != "ips" {
			return fmt.Errorf("capability %q is not one rdma-netns with \"dra\" uses (ips)", c)
		}
	}
	sent, err := libcni.InjectConf(p, map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
	if err != nil {
		return err
	}
	_, err = config.Parse(sent.Bytes, "")
	return err
}

// draAttachment is one element of a pod's networks annotation on a NAD
// with "dra".
type draAttachment struct {
	Name      string         `json:"name"`
	Interface string         `json:"interface"`
	IPs       []string       `json:"ips"`
	CNIArgs   map[string]any `json:"cni-args"`
}

// draExamples are the DRA objects of conf/, checked against each other:
// what a user applies together must fit together.
type draExamples struct {
	classes   map[string]*resourcev1.DeviceClass
	templates map[string]*resourcev1.ResourceClaimTemplate
	nads      map[string]*networkAttachmentDefinition // those with "dra"
	pods      []object
}

func (d *draExamples) add(o object) {
	if d.classes == nil {
		d.classes = map[string]*resourcev1.DeviceClass{}
		d.templates = map[string]*resourcev1.ResourceClaimTemplate{}
		d.nads = map[string]*networkAttachmentDefinition{}
	}
	switch obj := o.obj.(type) {
	case *resourcev1.DeviceClass:
		d.classes[obj.Name] = obj
	case *resourcev1.ResourceClaimTemplate:
		d.templates[obj.Name] = obj
	case *networkAttachmentDefinition:
		if draOf(obj) != nil {
			d.nads[obj.Name] = obj
		}
	case *corev1.Pod:
		if len(obj.Spec.ResourceClaims) > 0 {
			d.pods = append(d.pods, o)
		}
	}
}

// draOf is the "dra" object of a NAD's rdma-netns entry, nil without one.
func draOf(nad *networkAttachmentDefinition) *draNetConf {
	list, err := libcni.NetworkConfFromBytes([]byte(nad.Spec.Config))
	if err != nil {
		return nil
	}
	for _, p := range list.Plugins {
		if p.Network.Type == "rdma-netns" && isDRA(p.Bytes) {
			d, _, err := draEntry(p.Bytes)
			if err != nil {
				return nil // checkChain reports it
			}
			return &d
		}
	}
	return nil
}

func (d *draExamples) check() []error {
	var errs []error
	for _, c := range d.classes {
		if err := checkDeviceClass(c); err != nil {
			errs = append(errs, fmt.Errorf("DeviceClass %s: %w", c.Name, err))
		}
	}
	for _, tpl := range d.templates {
		for _, r := range tpl.Spec.Spec.Devices.Requests {
			if r.Exactly == nil {
				errs = append(errs, fmt.Errorf("ResourceClaimTemplate %s: request %s asks for no DeviceClass", tpl.Name, r.Name))
				continue
			}
			if _, outside := outsideClasses[r.Exactly.DeviceClassName]; d.classes[r.Exactly.DeviceClassName] == nil && !outside {
				errs = append(errs, fmt.Errorf("ResourceClaimTemplate %s: request %s asks for DeviceClass %s, neither one of conf/ nor one the docs name (%v)",
					tpl.Name, r.Name, r.Exactly.DeviceClassName, slices.Sorted(maps.Keys(outsideClasses))))
			}
		}
		if err := checkPairs(tpl); err != nil {
			errs = append(errs, fmt.Errorf("ResourceClaimTemplate %s: %w", tpl.Name, err))
		}
		if hasNetdevSelector(tpl) {
			if _, err := railSelectors(tpl); err != nil {
				errs = append(errs, fmt.Errorf("ResourceClaimTemplate %s: %w", tpl.Name, err))
			}
		}
	}
	for _, nad := range d.nads {
		if err := checkDRATuning(nad); err != nil {
			errs = append(errs, fmt.Errorf("NetworkAttachmentDefinition %s: %w", nad.Name, err))
		}
	}
	for _, o := range d.pods {
		if err := d.checkPod(o.obj.(*corev1.Pod)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.where, err))
		}
	}
	return errs
}

// checkDeviceClass: the class is the one the docs name and selects the
// devices of rdma-netns-dra.
func checkDeviceClass(c *resourcev1.DeviceClass) error {
	if c.Name != draDeviceClass {
		return fmt.Errorf("the docs and examples name the class %s", draDeviceClass)
	}
	want := fmt.Sprintf("device.driver == %q", drarecord.DriverName)
	if len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil || strings.TrimSpace(c.Spec.Selectors[0].CEL.Expression) != want {
		return fmt.Errorf("selectors %+v: want the one CEL expression %s", c.Spec.Selectors, want)
	}
	return nil
}

// podRequests are the device requests a pod's claims make: those for
// NICs of draDeviceClass with how many devices each gets (0: All,
// unknown until allocation), and the others with their DeviceClass.
type podRequests struct {
	nics   map[string]int64
	others map[string]string
	// outside: a request for a class of another driver (GPUs), whose
	// devices reach a container only when it names the claim.
	outside map[string][]string // pod claim name -> those requests
}

func (d *draExamples) requestsOf(pod *corev1.Pod) (podRequests, error) {
	pr := podRequests{nics: map[string]int64{}, others: map[string]string{}, outside: map[string][]string{}}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil {
			continue // a claim of its own name: not in conf/
		}
		tpl := d.templates[*rc.ResourceClaimTemplateName]
		if tpl == nil {
			return pr, fmt.Errorf("resourceClaims %s: no ResourceClaimTemplate %s in conf/", rc.Name, *rc.ResourceClaimTemplateName)
		}
		for _, r := range tpl.Spec.Spec.Devices.Requests {
			if r.Exactly == nil || r.Exactly.DeviceClassName != draDeviceClass {
				class := ""
				if r.Exactly != nil {
					class = r.Exactly.DeviceClassName
				}
				pr.others[r.Name] = class
				if _, ok := outsideClasses[class]; ok {
					pr.outside[rc.Name] = append(pr.outside[rc.Name], r.Name)
				}
				continue
			}
			pr.nics[r.Name] += exactCount(r.Exactly)
		}
	}
	return pr, nil
}

// exactCount is how many devices a request gets: 0 for All, unknown
// until allocation.
func exactCount(r *resourcev1.ExactDeviceRequest) int64 {
	switch {
	case r.AllocationMode == resourcev1.DeviceAllocationModeAll:
		return 0
	case r.AllocationMode == resourcev1.DeviceAllocationModeExactCount && r.Count > 0:
		return r.Count
	}
	return 1
}

// checkPod: each of the pod's attachments on a NAD with "dra" names a
// request the pod's claims make and an index within it, no two take the
// same NIC, and the addresses it asks for reach the IPAM.
func (d *draExamples) checkPod(pod *corev1.Pod) error {
	reqs, err := d.requestsOf(pod)
	if err != nil {
		return err
	}
	if err := claimsNamed(pod, reqs); err != nil {
		return err
	}
	if strings.TrimSpace(pod.Annotations["k8s.v1.cni.cncf.io/networks"]) == "" {
		return d.checkClaimOnly(pod)
	}
	var sel []draAttachment
	if err := json.Unmarshal([]byte(pod.Annotations["k8s.v1.cni.cncf.io/networks"]), &sel); err != nil {
		return fmt.Errorf("networks annotation: %w", err)
	}
	taken := map[string]string{}
	ifaces := map[string]bool{}
	devNames := map[string]string{}
	for _, a := range sel {
		nad := d.nads[a.Name]
		if nad == nil {
			continue
		}
		if a.Interface == "" || ifaces[a.Interface] {
			return fmt.Errorf("network %s: interface %q missing or used twice", a.Name, a.Interface)
		}
		ifaces[a.Interface] = true
		nic, err := pickedNIC(*draOf(nad), a, reqs)
		if err != nil {
			return fmt.Errorf("network %s (%s): %w", a.Name, a.Interface, err)
		}
		if name := rdmaDevNameOf(nad); name != "" {
			if other, ok := devNames[name]; ok {
				return fmt.Errorf("%s and %s both name their RDMA device %s: the second ADD finds the name taken in the pod", other, a.Interface, name)
			}
			devNames[name] = a.Interface
		}
		if other, ok := taken[nic]; ok {
			return fmt.Errorf("%s and %s both take NIC %s", other, a.Interface, nic)
		}
		taken[nic] = a.Interface
		if len(a.IPs) > 0 && !declaresIPs(nad) {
			return fmt.Errorf("network %s (%s) asks for ips, but its rdma-netns entry lacks the ips capability: Multus would not pass them", a.Name, a.Interface)
		}
	}
	return nil
}

// pickedNIC says which of the pod's NICs an attachment takes: the NAD's
// request and index, or the pod's draRequest and draIndex where the NAD
// leaves them unset (a pod may not override the NAD).
func pickedNIC(dra draNetConf, a draAttachment, reqs podRequests) (string, error) {
	counts := reqs.nics
	request, index := "", -1
	if dra.Request != nil {
		request = *dra.Request
	}
	if dra.Index != nil {
		index = *dra.Index
	}
	if v, ok := a.CNIArgs["draRequest"]; ok {
		s, isStr := v.(string)
		if dra.Request != nil || !isStr {
			return "", fmt.Errorf("cni-args draRequest %v: a string, and only where the NAD sets no request", v)
		}
		request = s
	}
	if v, ok := a.CNIArgs["draIndex"]; ok {
		f, isNum := v.(float64)
		if dra.Index != nil || !isNum || f != float64(int(f)) || f < 0 {
			return "", fmt.Errorf("cni-args draIndex %v: a whole number, and only where the NAD sets no index", v)
		}
		index = int(f)
	}
	if request != "" {
		n, ok := counts[request]
		if class, other := reqs.others[request]; other {
			return "", fmt.Errorf("request %q asks for DeviceClass %s, not for NICs of %s: rdma-netns finds no NIC of it", request, class, draDeviceClass)
		}
		if !ok {
			return "", fmt.Errorf("request %q is not one of the pod's claims' (%v)", request, slices.Sorted(maps.Keys(counts)))
		}
		if index < 0 && n != 1 {
			return "", fmt.Errorf("request %q gets %d NICs and no index picks one", request, n)
		}
		if n > 0 && int64(index) >= n {
			return "", fmt.Errorf("index %d of request %q, which gets %d NICs", index, request, n)
		}
	}
	return fmt.Sprintf("%s[%d]", request, max(index, 0)), nil
}

func declaresIPs(nad *networkAttachmentDefinition) bool {
	list, err := libcni.NetworkConfFromBytes([]byte(nad.Spec.Config))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(list.Plugins, func(p *libcni.PluginConfig) bool {
		return p.Network.Type == "rdma-netns" && p.Network.Capabilities["ips"]
	})
}

// The DRA examples' checks fail on the mistakes they exist for.
func TestDRAChainRejects(t *testing.T) {
	chain := func(plugins string) string {
		return `{"cniVersion": "1.0.0", "name": "n", "plugins": [` + plugins + `]}`
	}
	const entry = `{"type": "rdma-netns", "dra": {"request": "nics"}, "capabilities": {"ips": true}, "ipam": {"type": "static"}}`
	for _, tc := range []struct {
		name, conf, want string
	}{
		{"valid baseline", chain(entry), ""},
		{"host-device before it", chain(`{"type": "host-device", "device": "eth1"}, ` + entry), "must come first"},
		{"host-device after it", chain(entry + `, {"type": "host-device"}`), "second mover"},
		{"typo in dra", chain(`{"type": "rdma-netns", "dra": {"requests": "nics"}, "ipam": {"type": "static"}}`), `unknown field "requests"`},
		{"index as a string", chain(`{"type": "rdma-netns", "dra": {"index": "0"}, "ipam": {"type": "static"}}`), "index"},
		{"recordDir, even the node's", chain(`{"type": "rdma-netns", "dra": {"recordDir": "/var/lib/cni/rdma-netns-dra"}, "ipam": {"type": "static"}}`), `unknown field "recordDir"`},
		{"no ipam", chain(`{"type": "rdma-netns", "dra": {}}`), `no "ipam"`},
		{"typo beside dra", chain(`{"type": "rdma-netns", "dra": {}, "ipam": {"type": "static"}, "rdmaDevname": "x"}`), `unknown field "rdmaDevname"`},
		{"capability it does not use", chain(`{"type": "rdma-netns", "dra": {}, "ipam": {"type": "static"}, "capabilities": {"deviceID": true}}`), `"deviceID"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRejection(t, "valid chain", checkChain([]byte(tc.conf), "n", ""), tc.want)
		})
	}
}

func TestDRAPodRejects(t *testing.T) {
	nics := func(count int64) *resourcev1.ResourceClaimTemplate {
		tpl := &resourcev1.ResourceClaimTemplate{}
		tpl.Name = "t"
		tpl.Spec.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "nics", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: draDeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}}}
		return tpl
	}
	nad := func(dra string, caps string) *networkAttachmentDefinition {
		n := &networkAttachmentDefinition{}
		n.Name = "rdma-dra"
		n.Spec.Config = `{"cniVersion": "1.0.0", "name": "rdma-dra", "plugins": [{"type": "rdma-netns", "dra": ` + dra + caps + `, "ipam": {"type": "static"}}]}`
		return n
	}
	const ips = `, "capabilities": {"ips": true}`
	const two = `[{"name": "rdma-dra", "interface": "net1", "cni-args": {"draIndex": 0}, "ips": ["10.0.0.2/24"]},
	              {"name": "rdma-dra", "interface": "net2", "cni-args": {"draIndex": 1}, "ips": ["10.0.1.2/24"]}]`
	for _, tc := range []struct {
		name     string
		tpl      *resourcev1.ResourceClaimTemplate
		nad      *networkAttachmentDefinition
		networks string
		want     string
	}{
		{"valid baseline", nics(2), nad(`{"request": "nics"}`, ips), two, ""},
		{"same NIC twice", nics(2), nad(`{"request": "nics"}`, ips), strings.Replace(two, `"draIndex": 1`, `"draIndex": 0`, 1), "both take"},
		{"index past the count", nics(1), nad(`{"request": "nics"}`, ips), two, "index 1 of request \"nics\", which gets 1"},
		{"request the claims do not make", nics(2), nad(`{"request": "nic0"}`, ips), two, `request "nic0" is not one`},
		{"pod overrides the NAD's index", nics(2), nad(`{"request": "nics", "index": 0}`, ips), two, "only where the NAD sets no index"},
		{"no index for two NICs", nics(2), nad(`{"request": "nics"}`, ips), `[{"name": "rdma-dra", "interface": "net1"}]`, "no index picks one"},
		{"ips without the capability", nics(2), nad(`{"request": "nics"}`, ""), two, "lacks the ips capability"},
		{"interface twice", nics(2), nad(`{"request": "nics"}`, ips), strings.Replace(two, "net2", "net1", 1), "used twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{}
			pod.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": tc.networks}
			tplName := "t"
			pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nics", ResourceClaimTemplateName: &tplName}}
			var d draExamples
			d.add(object{obj: tc.tpl})
			d.add(object{obj: tc.nad})
			wantRejection(t, "valid pod", d.checkPod(pod), tc.want)
		})
	}
}

func TestDeviceClassRejects(t *testing.T) {
	for _, tc := range []struct{ name, class, expr, want string }{
		{"valid baseline", draDeviceClass, `device.driver == "nic.rdma-netns.io"`, ""},
		{"another driver", draDeviceClass, `device.driver == "rdma-netns.io"`, "want the one CEL expression"},
		{"another name", "rdma-nic", `device.driver == "nic.rdma-netns.io"`, "name the class"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &resourcev1.DeviceClass{}
			c.Name = tc.class
			c.Spec.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: tc.expr}}}
			wantRejection(t, "valid class", checkDeviceClass(c), tc.want)
		})
	}
}

// checkClaimOnly: a pod with no networks annotation gets its NICs from
// its claims alone, so each template it names configures the driver for
// its NIC requests, in a configuration Prepare accepts (what rdma-netns-dra
// checks, run on the template as the allocation would give it: each
// request's count of devices); a template that configures nothing would
// leave the pod without its NICs.
func (d *draExamples) checkClaimOnly(pod *corev1.Pod) error {
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil {
			continue
		}
		tpl := d.templates[*rc.ResourceClaimTemplateName]
		var entries []draconfig.Entry
		for _, c := range tpl.Spec.Spec.Devices.Config {
			if c.Opaque == nil || c.Opaque.Driver != drarecord.DriverName {
				continue
			}
			entries = append(entries, draconfig.Entry{Source: draconfig.FromClaim, Requests: c.Requests, Parameters: c.Opaque.Parameters.Raw})
		}
		if len(entries) == 0 {
			return fmt.Errorf("resourceClaims %s: template %s configures no %s and the pod names no network: its NICs would not be attached", rc.Name, tpl.Name, drarecord.DriverName)
		}
		var results []draconfig.Result
		for _, r := range tpl.Spec.Spec.Devices.Requests {
			if r.Exactly == nil || r.Exactly.DeviceClassName != draDeviceClass {
				continue
			}
			for i := range max(exactCount(r.Exactly), 1) {
				results = append(results, draconfig.Result{Request: r.Name, Device: fmt.Sprintf("pci-0000-00-%02x-0", i+3)})
			}
		}
		if _, err := draconfig.Resolve(entries, results); err != nil {
			return fmt.Errorf("resourceClaims %s: template %s: %w", rc.Name, tpl.Name, err)
		}
	}
	return nil
}
