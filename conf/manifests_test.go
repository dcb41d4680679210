package conf

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/rdma-netns/rdma-netns/pkg/config"
)

// networkAttachmentDefinition mirrors k8s.cni.cncf.io/v1
// NetworkAttachmentDefinition. The upstream client module
// (github.com/k8snetworkplumbingwg/network-attachment-definition-client)
// is not reachable through the module proxy here, and its type is only
// this much anyway.
type networkAttachmentDefinition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Config string `json:"config,omitempty"`
	} `json:"spec"`
}

// serviceMonitor mirrors the part of monitoring.coreos.com/v1 ServiceMonitor
// that conf/ uses; fields outside it fail strict decoding, so extend it
// when an example needs more.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			HonorLabels   bool   `json:"honorLabels,omitempty"`
			// Scheme, TLSConfig and BearerTokenFile: the exporter's HTTPS
			// and Prometheus's token (tlsConfig is the operator's
			// SafeTLSConfig, passed through from the chart's values).
			Scheme          string         `json:"scheme,omitempty"`
			TLSConfig       map[string]any `json:"tlsConfig,omitempty"`
			BearerTokenFile string         `json:"bearerTokenFile,omitempty"`
			Authorization   map[string]any `json:"authorization,omitempty"`
			Relabelings     []struct {
				SourceLabels []string `json:"sourceLabels,omitempty"`
				TargetLabel  string   `json:"targetLabel,omitempty"`
			} `json:"relabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// kinds are the objects conf/ may contain. A kind missing here fails the
// test rather than going unchecked: add it with its Go type.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":                   {"v1", func() any { return &corev1.Namespace{} }},
	"ServiceAccount":              {"v1", func() any { return &corev1.ServiceAccount{} }},
	"ConfigMap":                   {"v1", func() any { return &corev1.ConfigMap{} }},
	"Pod":                         {"v1", func() any { return &corev1.Pod{} }},
	"DaemonSet":                   {"apps/v1", func() any { return &appsv1.DaemonSet{} }},
	"NetworkAttachmentDefinition": {"k8s.cni.cncf.io/v1", func() any { return &networkAttachmentDefinition{} }},
	"Service":                     {"v1", func() any { return &corev1.Service{} }},
	"ServiceMonitor":              {"monitoring.coreos.com/v1", func() any { return &serviceMonitor{} }},
	"RuntimeClass":                {"node.k8s.io/v1", func() any { return &nodev1.RuntimeClass{} }},
	"ClusterRole":                 {"rbac.authorization.k8s.io/v1", func() any { return &rbacv1.ClusterRole{} }},
	"ClusterRoleBinding":          {"rbac.authorization.k8s.io/v1", func() any { return &rbacv1.ClusterRoleBinding{} }},
	"DeviceClass":                 {"resource.k8s.io/v1", func() any { return &resourcev1.DeviceClass{} }},
	"ResourceClaimTemplate":       {"resource.k8s.io/v1", func() any { return &resourcev1.ResourceClaimTemplate{} }},
	"ValidatingAdmissionPolicy":   {"admissionregistration.k8s.io/v1", func() any { return &admissionregistrationv1.ValidatingAdmissionPolicy{} }},
	"ValidatingAdmissionPolicyBinding": {"admissionregistration.k8s.io/v1", func() any {
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	}},
}

// object is one decoded YAML document.
type object struct {
	where string // file and document number, for messages
	kind  string
	obj   any
}

// decodeManifests splits a (multi-document) YAML file and decodes each
// document strictly into the Go type of its kind.
//
// Strict means what the API server's field validation does: the YAML is
// converted to JSON refusing duplicate keys, then decoded with
// sigs.k8s.io/json, which rejects unknown fields and, unlike encoding/json,
// matches field names case-sensitively (imagepullpolicy is a typo too).
func decodeManifests(name string, data []byte) ([]object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []object
	var errs []error
	for i := 1; ; i++ {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		where := fmt.Sprintf("%s (document %d)", name, i)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		o, err := decodeStrict(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if o == nil { // only comments, or the empty document before a leading ---
			continue
		}
		o.where = where
		objs = append(objs, *o)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s: no Kubernetes object in the file", name)
	}
	return objs, nil
}

func decodeStrict(doc []byte) (*object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil, nil
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	k, ok := kinds[tm.Kind]
	if !ok {
		return nil, fmt.Errorf("kind %q is not one this test knows how to check", tm.Kind)
	}
	if tm.APIVersion != k.apiVersion {
		return nil, fmt.Errorf("%s has apiVersion %q, want %q", tm.Kind, tm.APIVersion, k.apiVersion)
	}
	obj := k.new()
	strictErrs, err := sigsjson.UnmarshalStrict(js, obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("%s: %w", tm.Kind, errors.Join(strictErrs...))
	}
	return &object{kind: tm.Kind, obj: obj}, nil
}

// Values a runtime would pass for the capabilities rdma-netns declares.
// Multus sets deviceID from the device plugin's allocation and
// CNIDeviceInfoFile to a per-attachment path under its devinfo directory.
var capabilityArgs = map[string]any{
	"deviceID":          "0000:3b:02.1",
	"CNIDeviceInfoFile": "/var/run/k8s.cni.cncf.io/devinfo/cni/example-net1-device-info.json",
}

// checkChain checks a conflist as libcni would run it and the rdma-netns
// entry in it as the plugin would receive it. name is the network name the
// list must carry ("" for any); deviceID, when set, is what Multus adds to
// every entry of a network with a resourceName annotation.
func checkChain(raw []byte, name, deviceID string) error {
	// libcni ignores unknown top-level keys; a misspelt "plugins" or
	// "disableCheck" would silently change what runs.
	var top struct {
		CNIVersion             string            `json:"cniVersion"`
		CNIVersions            []string          `json:"cniVersions,omitempty"`
		Name                   string            `json:"name"`
		DisableCheck           bool              `json:"disableCheck,omitempty"`
		DisableGC              bool              `json:"disableGC,omitempty"`
		LoadOnlyInlinedPlugins bool              `json:"loadOnlyInlinedPlugins,omitempty"`
		Plugins                []json.RawMessage `json:"plugins"`
	}
	if strictErrs, err := sigsjson.UnmarshalStrict(raw, &top); err != nil || len(strictErrs) > 0 {
		return fmt.Errorf("not a strict conflist: %w", errors.Join(append(strictErrs, err)...))
	}
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		return err
	}
	if list.CNIVersion == "" {
		return errors.New("conflist sets no cniVersion")
	}
	if name != "" && list.Name != name {
		return fmt.Errorf("network name %q differs from %q, the NAD or file name", list.Name, name)
	}
	if len(list.Plugins) == 0 {
		return errors.New("conflist has no plugins")
	}
	found := 0
	for i, p := range list.Plugins {
		if p.Network.Type == "" {
			return fmt.Errorf("plugin %d has no type", i)
		}
		if p.Network.Type != "rdma-netns" {
			continue
		}
		found++
		if isDRA(p.Bytes) {
			if err := checkDRAChain(i, list); err != nil {
				return err
			}
			if err := checkDRAEntry(p, list); err != nil {
				return fmt.Errorf("plugin %d (rdma-netns): %w", i, err)
			}
			continue
		}
		if i == 0 {
			return errors.New("rdma-netns is the first plugin; it needs the prevResult of the plugin that moves the netdev (host-device, sriov)")
		}
		if err := checkRdmaNetns(p, list, deviceID); err != nil {
			return fmt.Errorf("plugin %d (rdma-netns): %w", i, err)
		}
	}
	if found != 1 {
		return fmt.Errorf("conflist has %d rdma-netns entries, want 1", found)
	}
	return nil
}

func checkRdmaNetns(p *libcni.PluginConfig, list *libcni.NetworkConfigList, deviceID string) error {
	// config.Parse ignores unknown keys, as CNI plugins must for keys the
	// runtime adds; in a file we write, an unknown key is a typo that would
	// silently drop a setting ("rdmaDevname").
	if strictErrs, err := sigsjson.UnmarshalStrict(p.Bytes, &config.NetConf{}); err != nil || len(strictErrs) > 0 {
		return fmt.Errorf("unknown or mistyped field: %w", errors.Join(append(strictErrs, err)...))
	}
	for c, on := range p.Network.Capabilities {
		if _, ok := capabilityArgs[c]; on && !ok {
			return fmt.Errorf("capability %q is not one rdma-netns reads (deviceID, CNIDeviceInfoFile)", c)
		}
	}

	// What libcni's buildOneConfig sends: the list's name and version, the
	// previous plugin's result, and runtimeConfig for each capability.
	prev, err := (&current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: "net1", Mac: "b4:96:91:aa:bb:cc", Sandbox: "/var/run/netns/cni-test"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: mustCIDR("10.100.100.2/29")}},
	}).GetAsVersion(list.CNIVersion)
	if err != nil {
		return fmt.Errorf("cniVersion %s: %w", list.CNIVersion, err)
	}
	inject := map[string]any{"name": list.Name, "cniVersion": list.CNIVersion, "prevResult": prev}
	if deviceID != "" {
		inject["deviceID"] = deviceID
	}
	rc := map[string]any{}
	for c, on := range p.Network.Capabilities {
		if on {
			rc[c] = capabilityArgs[c]
		}
	}
	if len(rc) > 0 {
		inject["runtimeConfig"] = rc
	}
	sent, err := libcni.InjectConf(p, inject)
	if err != nil {
		return err
	}
	conf, err := config.Parse(sent.Bytes, "")
	if err != nil {
		return err
	}
	if conf.Result == nil || len(conf.Result.Interfaces) != 1 {
		return fmt.Errorf("prevResult did not reach the plugin: %s", sent.Bytes)
	}
	return nil
}

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

// confFiles lists the files of conf/ with one of the extensions.
func confFiles(t *testing.T, exts ...string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// The chart's files are templates, checked through what they
		// render (chart_test.go).
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || path == "helm") {
			return filepath.SkipDir
		}
		if !d.IsDir() && slices.Contains(exts, filepath.Ext(path)) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no %v files under conf/: is the test running in conf/?", exts)
	}
	return files
}

func TestManifests(t *testing.T) {
	nads := map[string]bool{}
	podNetworks := map[string][]string{} // pod -> networks it asks for
	var daemonSets []*appsv1.DaemonSet
	var services []*corev1.Service
	var monitors []*serviceMonitor
	var roles rbac
	var dra draExamples
	wantsDeviceID := map[string]string{} // NAD -> file, for device-info without a resource
	selectedByID := map[string]bool{}    // networks some pod selects with a deviceID
	for _, f := range confFiles(t, ".yaml", ".yml") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeManifests(f, data)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, o := range objs {
			roles.add(o.obj)
			dra.add(o)
			switch obj := o.obj.(type) {
			case *appsv1.DaemonSet:
				if err := checkDaemonSet(obj); err != nil {
					t.Errorf("%s: %v", o.where, err)
				}
				daemonSets = append(daemonSets, obj)
			case *corev1.Service:
				services = append(services, obj)
			case *serviceMonitor:
				monitors = append(monitors, obj)
			case *networkAttachmentDefinition:
				nads[obj.Name] = true
				if err := checkChain([]byte(obj.Spec.Config), obj.Name, deviceIDFor(obj)); err != nil {
					t.Errorf("%s: NetworkAttachmentDefinition %s: spec.config: %v", o.where, obj.Name, err)
				}
				if deviceIDFor(obj) == "" && declaresDeviceInfo([]byte(obj.Spec.Config)) {
					wantsDeviceID[obj.Name] = o.where
				}
			case *corev1.Pod:
				nets, err := networksOf(obj)
				if err != nil {
					t.Errorf("%s: %v", o.where, err)
				}
				podNetworks[o.where] = nets
				if err := checkPodAnnotations(obj); err != nil {
					t.Errorf("%s: %v", o.where, err)
				}
				for _, n := range selectedWithDeviceID(obj) {
					selectedByID[n] = true
				}
			}
		}
	}
	for _, ds := range daemonSets {
		if err := checkRBAC(ds, &roles); err != nil {
			t.Errorf("DaemonSet %s: %v", ds.Name, err)
		}
	}
	for _, svc := range services {
		if err := checkServiceTargets(svc, daemonSets); err != nil {
			t.Errorf("Service %s: %v", svc.Name, err)
		}
	}
	for _, sm := range monitors {
		if err := checkServiceMonitor(sm, services); err != nil {
			t.Errorf("ServiceMonitor %s: %v", sm.Name, err)
		}
	}
	// Multus passes a CNIDeviceInfoFile only to an attachment with a
	// deviceID (e2e/multus shows it): from a resourceName, or from the pod's
	// network-selection element. Without either the capability promises a
	// network-status device-info that never appears.
	for _, err := range dra.check() {
		t.Error(err)
	}
	for nad, where := range wantsDeviceID {
		if !selectedByID[nad] {
			t.Errorf("%s: NetworkAttachmentDefinition %s declares CNIDeviceInfoFile but has no resourceName and no pod in conf/ selects it with a deviceID: Multus would pass no device-info file", where, nad)
		}
	}
	for pod, nets := range podNetworks {
		for _, n := range nets {
			if !nads[n] {
				t.Errorf("%s asks for network %q, which no NetworkAttachmentDefinition in conf/ defines", pod, n)
			}
		}
	}
}

// deviceIDFor is what Multus puts in every entry of the chain: for a network
// with a resourceName it looks up the device the pod was allocated.
func deviceIDFor(nad *networkAttachmentDefinition) string {
	if nad.Annotations["k8s.v1.cni.cncf.io/resourceName"] == "" {
		return ""
	}
	return capabilityArgs["deviceID"].(string)
}

// checkDaemonSet catches what the API server would refuse on apply.
func checkDaemonSet(ds *appsv1.DaemonSet) error {
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return err
	}
	if sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		return fmt.Errorf("selector %s does not match the pod template labels %v", sel, ds.Spec.Template.Labels)
	}
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if c.Name == "" || c.Image == "" {
			return fmt.Errorf("container %q has no name or image", c.Name)
		}
		if sc := c.SecurityContext; sc == nil || sc.Privileged != nil && *sc.Privileged {
			return fmt.Errorf("container %q must not be privileged and must set a securityContext", c.Name)
		}
	}
	bins, err := imageBinaries()
	if err != nil {
		return err
	}
	if driverOnly(ds.Spec.Template.Spec) {
		return checkDriverDaemonSet(ds.Spec.Template.Spec, bins)
	}
	if err := checkInstaller(ds.Spec.Template.Spec, bins); err != nil {
		return err
	}
	if runs(ds.Spec.Template.Spec, "/rdma-netns-exporter") {
		if err := checkExporter(ds.Spec.Template.Spec); err != nil {
			return fmt.Errorf("container exporter: %w", err)
		}
	}
	if runs(ds.Spec.Template.Spec, draBinary) {
		return errors.New("the DRA driver runs beside the installer: it needs a DaemonSet of its own, whose ServiceAccount only it uses")
	}
	if !runs(ds.Spec.Template.Spec, "/rdma-netns-nri") {
		return nil // nri.enabled=false: nothing of NRI to check
	}
	return checkNRI(ds.Spec.Template.Spec)
}

// runs tells whether a container of the pod runs the image's binary bin.
func runs(spec corev1.PodSpec, bin string) bool {
	for _, c := range spec.Containers {
		if len(c.Command) > 0 && c.Command[0] == bin {
			return true
		}
	}
	return false
}

// checkServiceTargets: a Service of conf/ selects the pods of a DaemonSet
// of conf/ in its namespace, and each of its ports leads to a port one of
// their containers declares.
func checkServiceTargets(svc *corev1.Service, daemonSets []*appsv1.DaemonSet) error {
	for _, ds := range daemonSets {
		if ds.Namespace != svc.Namespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if !declaresPort(ds.Spec.Template.Spec.Containers, p.TargetPort.String()) {
				return fmt.Errorf("port %s targets %s, which no container of DaemonSet %s declares", p.Name, p.TargetPort.String(), ds.Name)
			}
		}
		return nil
	}
	return fmt.Errorf("selector %v matches no DaemonSet of conf/ in namespace %s", svc.Spec.Selector, svc.Namespace)
}

func declaresPort(containers []corev1.Container, port string) bool {
	for _, c := range containers {
		for _, cp := range c.Ports {
			if cp.Name == port || fmt.Sprint(cp.ContainerPort) == port {
				return true
			}
		}
	}
	return false
}

// checkServiceMonitor: the monitor selects a Service of conf/ in a namespace
// it watches, and scrapes ports that Service has.
func checkServiceMonitor(sm *serviceMonitor, services []*corev1.Service) error {
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		return err
	}
	if len(sm.Spec.Endpoints) == 0 {
		return fmt.Errorf("no endpoints")
	}
	for _, svc := range services {
		watched := len(sm.Spec.NamespaceSelector.MatchNames) == 0 && svc.Namespace == sm.Namespace || slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace)
		if !watched || sel.Empty() || !sel.Matches(labels.Set(svc.Labels)) {
			continue
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				return fmt.Errorf("endpoint port %q is not a port of Service %s", ep.Port, svc.Name)
			}
		}
		return nil
	}
	return fmt.Errorf("selector %s matches no Service of conf/ it watches", sel)
}

// networksOf reads the Multus networks annotation, in either of its forms:
// "name, ns/name@ifname" or a JSON list of {"name": ...}.
func networksOf(pod *corev1.Pod) ([]string, error) {
	v := strings.TrimSpace(pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	if v == "" {
		return nil, nil
	}
	var names []string
	if strings.HasPrefix(v, "[") {
		var sel []struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(v), &sel); err != nil {
			return nil, fmt.Errorf("networks annotation: %w", err)
		}
		for _, s := range sel {
			names = append(names, s.Name)
		}
		return names, nil
	}
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if _, after, ok := strings.Cut(n, "/"); ok {
			n = after
		}
		n, _, _ = strings.Cut(n, "@")
		names = append(names, n)
	}
	return names, nil
}

// declaresDeviceInfo says whether the rdma-netns entry of a chain asks for
// the device-info file.
func declaresDeviceInfo(raw []byte) bool {
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		return false
	}
	for _, p := range list.Plugins {
		if p.Network.Type == "rdma-netns" && p.Network.Capabilities["CNIDeviceInfoFile"] {
			return true
		}
	}
	return false
}

// selectedWithDeviceID lists the networks the pod selects with a deviceID in
// the JSON form of the networks annotation.
func selectedWithDeviceID(pod *corev1.Pod) []string {
	var sel []struct {
		Name     string `json:"name"`
		DeviceID string `json:"deviceID"`
	}
	if json.Unmarshal([]byte(pod.Annotations["k8s.v1.cni.cncf.io/networks"]), &sel) != nil {
		return nil
	}
	var names []string
	for _, s := range sel {
		if s.DeviceID != "" {
			names = append(names, s.Name)
		}
	}
	return names
}

func TestConflists(t *testing.T) {
	for _, f := range confFiles(t, ".conflist") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// libcni looks a network up by the name inside the file; naming the
		// file after it keeps `cnitool add <name>` guessable.
		if err := checkChain(data, strings.TrimSuffix(filepath.Base(f), ".conflist"), ""); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// The checks above must fail on the mistakes they exist for; each case is a
// document that a lenient decoder would accept.
func TestStrictDecodingRejects(t *testing.T) {
	const ds = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: x
spec:
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: c
          image: i
`
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"valid baseline", ds, ""},
		{"typo in a field name", ds + "          imagePulPolicy: Always\n", `unknown field "spec.template.spec.containers[0].imagePulPolicy"`},
		{"wrong case in a field name", ds + "          imagepullpolicy: Always\n", "imagepullpolicy"},
		{"duplicate key", ds + "          image: j\n", "already set"},
		{"field at the wrong level", strings.Replace(ds, "  selector:", "  hostNetwork: true\n  selector:", 1), `unknown field "spec.hostNetwork"`},
		{"bad quantity", ds + "          resources: {requests: {memory: 16MB}}\n", "quantities must match"},
		{"unknown kind", "apiVersion: v1\nkind: Pdo\nmetadata: {name: x}\n", `kind "Pdo"`},
		{"kind with the wrong apiVersion", strings.Replace(ds, "apps/v1", "extensions/v1beta1", 1), `want "apps/v1"`},
		{"bad second document", ds + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\nspce: {}\n", `(document 2)`},
		{"no object at all", "# only a comment\n---\n", "no Kubernetes object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeManifests("mem.yaml", []byte(tc.doc))
			wantRejection(t, "valid document", err, tc.want)
		})
	}
}

func TestChainRejects(t *testing.T) {
	chain := func(rdma string) string {
		return `{"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "host-device", "device": "eth1"}, ` + rdma + `]}`
	}
	for _, tc := range []struct {
		name, conf, want string
	}{
		{"valid baseline", chain(`{"type": "rdma-netns", "rdmaDevName": "rdma_net1", "rdmaQoS": {"tos": 106}, "capabilities": {"deviceID": true, "CNIDeviceInfoFile": true}}`), ""},
		{"typo in an rdma-netns field", chain(`{"type": "rdma-netns", "rdmaDevname": "rdma_net1"}`), `unknown field "rdmaDevname"`},
		{"typo in a nested rdma-netns field", chain(`{"type": "rdma-netns", "rdmaQoS": {"ToS": 106}}`), `rdmaQoS.ToS`},
		{"value config.Parse refuses", chain(`{"type": "rdma-netns", "rdmaQoS": {"tos": 300}}`), "out of range"},
		{"capability rdma-netns ignores", chain(`{"type": "rdma-netns", "capabilities": {"portMappings": true}}`), `"portMappings"`},
		{"rdma-netns first", `{"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "rdma-netns"}, {"type": "host-device"}]}`, "first plugin"},
		{"no rdma-netns", `{"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "host-device"}]}`, "0 rdma-netns"},
		{"cniVersion without prevResult", strings.Replace(chain(`{"type": "rdma-netns"}`), "1.1.0", "0.2.0", 1), "0.2.0"},
		{"misspelt plugins key", `{"cniVersion": "1.1.0", "name": "n", "plugin": [{"type": "rdma-netns"}]}`, `unknown field "plugin"`},
		{"name differs", strings.Replace(chain(`{"type": "rdma-netns"}`), `"n"`, `"m"`, 1), `network name "m" differs`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkChain([]byte(tc.conf), "n", "")
			wantRejection(t, "valid chain", err, tc.want)
		})
	}
}

// wantRejection fails the test unless err is what its case wants: nil for
// a valid input (what names that input), else an error containing want.
// A rejection is logged as the operator would read it.
func wantRejection(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("%s rejected: %v", what, err)
	case want != "" && err == nil:
		t.Fatalf("accepted, want an error containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
	if err != nil {
		t.Logf("rejected: %v", err)
	}
}
