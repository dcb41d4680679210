package conf

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The end-to-end suites apply these examples through the kustomize
// overlays of e2e/k8s/overlays (scripts/k8s/payload.sh renders them with
// cmd/kustomize, as kubectl kustomize does). A test VM is not the node an example is written
// for: its NICs have other names, and whereabouts is not installed. What
// the rig must change an overlay may change; anything else of an example
// it changes makes the suite test something a user does not apply, so it
// fails here. A NAD's config is a JSON string, which kustomize can only
// replace whole: its chain is compared plugin by plugin (chainChanges).
const overlaysDir = "../e2e/k8s/overlays"

// overlay is what one overlay may change of its example, and why.
type overlay struct {
	example string   // the file of conf/ it applies; "" for none
	paths   []string // JSON pointers (path.Match patterns) of an object that may differ, besides a NAD's /spec/config
	// plugins are the keys of a NAD's chain that may differ, per plugin
	// type, besides what the rig changes of every chain (rigChanged).
	plugins map[string][]string
	dropped []string // plugin types left out of every chain
	why     string
}

// overlays are every overlay of e2e/k8s/overlays. One missing here fails
// TestOverlaysApplyTheExamples: add it, with what it changes and why.
var overlays = map[string]overlay{
	"multus": {why: "Multus's own manifest, not an example of conf/"},
	"daemonset": {example: "daemonset.yaml",
		paths: []string{"/spec/template/spec/containers/*/image", "/spec/template/spec/initContainers/*/image"},
		why:   "the image `make image` builds, imported into the node (nothing is pulled)"},
	"nad-host-device": {example: "nad-host-device.yaml"},
	"nad-host-device-eth2": {example: "nad-host-device.yaml", paths: []string{"/metadata/name"},
		why: "a second NAD of the example, on another NIC, named with -eth2"},
	"nad-renamed": {example: "nad-renamed.yaml"},
	"nad-device-info": {example: "nad-device-info.yaml", plugins: map[string][]string{"rdma-netns": {"allowedPodDevices"}},
		why: "the VM's RDMA device (eth2's rxe2) in place of the example's irdma0 and irdma1"},
	"nad-rails":         {example: "nad-rails.yaml"},
	"nad-dra":           {example: "nad-dra.yaml"},
	"dra-deviceclass":   {example: "dra-deviceclass.yaml"},
	"dra-claimtemplate": {example: "dra-claimtemplate.yaml"},
	"nad-dra-rails":     {example: "nad-dra-rails.yaml"},
	"dra-claimtemplate-rails": {example: "dra-claimtemplate-rails.yaml", paths: []string{"/spec/spec/devices/requests/*/exactly/selectors/0/cel/expression"},
		why: "rail k's NIC as the node VMs name it (eth<k+1>) in each request's netdev selector"},
	"pod-dra": {example: "pod-dra.yaml", paths: []string{"/spec/containers/*/image"},
		why: "the suite's tools image (the VM has no GPU)"},
	"dra-claimtemplate-pairs":  {example: "dra-claimtemplate-pairs.yaml"},
	"dra-claimtemplate-attach": {example: "dra-claimtemplate-attach.yaml"},
	"pod-dra-attach": {example: "pod-dra-attach.yaml", paths: []string{"/spec/containers/*/image"},
		why: "the suite's tools image (the VM has no GPU)"},
	"pod-dra-pairs": {example: "pod-dra-pairs.yaml",
		paths: []string{"/spec/containers/*/image", "/spec/containers/*/resources/*", "/spec/containers/*/resources/*/*"},
		why:   "the suite's tools image and sizes that fit the 4 GiB VM (its GPUs are the stand-in driver's)"},
	"nad-rails-shared": {example: "nad-rails-shared-subnet.yaml", plugins: map[string][]string{"rdma-netns": {"rdmaDevName"}},
		why: "rdma_s<k> in place of rdma_r<k>, so that one pod holds these rails beside nad-rails's"},
	"nad-rails-shared-bare": {example: "nad-rails-shared-subnet.yaml", plugins: map[string][]string{"rdma-netns": {"rdmaDevName"}},
		dropped: []string{"tuning", "sbr"},
		why:     "not an example to follow: the shared rails without tuning and sbr, as TestTwoNodes shows them failing, named as nad-rails-shared's"},
	"pod-device-info": {example: "pod-device-info.yaml",
		paths: []string{"/spec/containers/*/image", "/spec/nodeName", "/metadata/annotations/k8s.v1.cni.cncf.io~1networks"},
		why:   "the suite's tools image, its node, and the VM's NIC's PCI address as the deviceID"},
	"pod-nccl": {example: "pod-nccl.yaml",
		paths: []string{"/spec/containers/*/image", "/spec/containers/*/resources/*", "/spec/containers/*/resources/*/*", "/metadata/annotations/rdma-netns.io~1shm-size"},
		why:   "the suite's tools image, no GPU, and sizes that fit the 4 GiB VM"},
	"pod-nccl-eth2": {example: "pod-nccl.yaml",
		paths: []string{"/spec/containers/*/image", "/spec/containers/*/resources/*", "/spec/containers/*/resources/*/*", "/metadata/annotations/rdma-netns.io~1shm-size",
			"/metadata/name", "/metadata/annotations/k8s.v1.cni.cncf.io~1networks"},
		why: "pod-nccl's changes, named nccl-worker-1 on nad-host-device-eth2"},
}

// rendered is one object: its kind and name, and the object.
type rendered struct {
	kind, name string
	obj        map[string]any
}

// renderOverlay renders an overlay as payload.sh does (cmd/kustomize, as
// kubectl kustomize --load-restrictor LoadRestrictionsNone does).
func renderOverlay(dir string) ([]rendered, error) {
	o := krusty.MakeDefaultOptions()
	o.LoadRestrictions = types.LoadRestrictionsNone
	m, err := krusty.MakeKustomizer(o).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	var out []rendered
	for _, r := range m.Resources() {
		obj, err := r.Map()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", r.CurId(), err)
		}
		out = append(out, rendered{kind: r.GetKind(), name: r.GetName(), obj: obj})
	}
	return out, nil
}

// exampleObjects reads a file of conf/ as the API server would get it.
func exampleObjects(file string) ([]rendered, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []rendered
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		if obj == nil {
			continue
		}
		kind, _ := obj["kind"].(string)
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		out = append(out, rendered{kind: kind, name: name, obj: obj})
	}
}

// overlayChanges lists how what an overlay renders differs from its
// example beyond what ov allows: the example's objects in its order and
// nothing else, each equal to the example's but for ov.paths, and each
// NAD's chain the example's but for the rig's changes, ov.plugins and
// ov.dropped. Objects pair by position: a renamed object (ov.paths
// holding /metadata/name) is the same object.
func overlayChanges(example, got []rendered, ov overlay) []string {
	var changes []string
	if len(got) != len(example) {
		changes = append(changes, fmt.Sprintf("%d objects, the example's %d", len(got), len(example)))
	}
	for i := range min(len(example), len(got)) {
		ex, r := example[i], got[i]
		id := ex.kind + "/" + ex.name
		if r.kind != ex.kind {
			changes = append(changes, fmt.Sprintf("object %d is a %s, the example's %s", i+1, r.kind, id))
			continue
		}
		exObj, gotObj := withoutConfig(ex), withoutConfig(r)
		for _, p := range diffPaths("", exObj, gotObj) {
			if !matchesAny(p, ov.paths) {
				changes = append(changes, fmt.Sprintf("%s: %s is %s, the example's %s", id, p, valueAt(gotObj, p), valueAt(exObj, p)))
			}
		}
		if ex.kind == "NetworkAttachmentDefinition" {
			for _, c := range chainChanges(configOf(ex), configOf(r), r.name, ov) {
				changes = append(changes, id+": "+c)
			}
		}
	}
	return changes
}

// withoutConfig is r's object without a NAD's /spec/config, which
// chainChanges compares.
func withoutConfig(r rendered) map[string]any {
	out := deepCopy(r.obj).(map[string]any)
	if spec, ok := out["spec"].(map[string]any); ok && r.kind == "NetworkAttachmentDefinition" {
		delete(spec, "config")
	}
	return out
}

func configOf(r rendered) string {
	spec, _ := r.obj["spec"].(map[string]any)
	s, _ := spec["config"].(string)
	return s
}

// chainChanges lists how a NAD's config (applied, of the NAD named name)
// differs from the example's beyond what the rig changes (rigChanged) and
// ov allows. The config's name must be its NAD's.
func chainChanges(example, applied, name string, ov overlay) []string {
	var ex, got map[string]any
	if err := json.Unmarshal([]byte(example), &ex); err != nil {
		return []string{"the example's config: " + err.Error()}
	}
	if err := json.Unmarshal([]byte(applied), &got); err != nil {
		return []string{"config: " + err.Error()}
	}
	var changes []string
	if got["name"] != name {
		changes = append(changes, fmt.Sprintf("config name %s, its NAD's %q", show(got["name"]), name))
	}
	for _, k := range keysOf(ex, got) {
		if k != "name" && k != "plugins" && !reflect.DeepEqual(ex[k], got[k]) {
			changes = append(changes, fmt.Sprintf("config %s is %s, the example's %s", k, show(got[k]), show(ex[k])))
		}
	}
	exPlugins, gotPlugins := pluginsOf(ex), pluginsOf(got)
	var kept []map[string]any
	for _, p := range exPlugins {
		if !slices.Contains(ov.dropped, typeOf(p)) {
			kept = append(kept, p)
		}
	}
	for _, d := range ov.dropped {
		if !slices.ContainsFunc(exPlugins, func(p map[string]any) bool { return typeOf(p) == d }) {
			changes = append(changes, fmt.Sprintf("leaves out %s, which the example's chain does not have", d))
		}
	}
	if exT, gotT := typesOf(kept), typesOf(gotPlugins); !slices.Equal(exT, gotT) {
		return append(changes, fmt.Sprintf("chain %v, the example's %v (less %v)", gotT, typesOf(exPlugins), ov.dropped))
	}
	for i, p := range gotPlugins {
		e := kept[i]
		typ := typeOf(p)
		for _, k := range keysOf(e, p) {
			if reflect.DeepEqual(e[k], p[k]) || slices.Contains(ov.plugins[typ], k) {
				continue
			}
			if why := rigChanged(typ, k, e, p); why != "" {
				changes = append(changes, fmt.Sprintf("%s: %s is %s, the example's %s: %s", typ, k, show(p[k]), show(e[k]), why))
			}
		}
	}
	return changes
}

// rigChanged says why a key of a plugin of the chain may not differ from
// the example's ("" when the rig may change it): host-device's NIC
// (device or pciBusID: the VM's names, not the example's node's) when
// both name one; its IPAM, static in place of another type (whereabouts
// is not installed in the test VMs) or the same type on another range;
// and the "ips" capability, with which static IPAM takes each pod's
// addresses from its network selection elements.
func rigChanged(typ, key string, ex, got map[string]any) string {
	if typ != "host-device" {
		return "only host-device's NIC and IPAM are the rig's to change"
	}
	switch key {
	case "device", "pciBusID":
		if ex[key] == nil || got[key] == nil {
			return "the rig may name another NIC, not change how the NIC is chosen"
		}
		return ""
	case "ipam":
		exI, _ := ex[key].(map[string]any)
		gotI, _ := got[key].(map[string]any)
		if gotI["type"] == "static" {
			return ""
		}
		exR, gotR := deepCopy(exI).(map[string]any), deepCopy(gotI).(map[string]any)
		delete(exR, "range")
		delete(gotR, "range")
		if exI != nil && gotI != nil && reflect.DeepEqual(exR, gotR) {
			return ""
		}
		return "the rig may use static IPAM, or the example's IPAM on another range"
	case "capabilities":
		exC, _ := ex[key].(map[string]any)
		gotC, _ := got[key].(map[string]any)
		rest := map[string]any{}
		for k, v := range gotC {
			if k != "ips" || v != true {
				rest[k] = v
			}
		}
		if exC == nil {
			exC = map[string]any{}
		}
		if reflect.DeepEqual(exC, rest) {
			return ""
		}
		return `the rig may add the "ips" capability alone (static IPAM's addresses per pod)`
	}
	return "only host-device's NIC and IPAM are the rig's to change"
}

// diffPaths lists the JSON pointers below at at which a and b differ: the
// leaves, and a list as a whole when the lengths differ.
func diffPaths(at string, a, b any) []string {
	am, aIsMap := a.(map[string]any)
	bm, bIsMap := b.(map[string]any)
	if aIsMap && bIsMap {
		var out []string
		for _, k := range keysOf(am, bm) {
			out = append(out, diffPaths(at+"/"+strings.NewReplacer("~", "~0", "/", "~1").Replace(k), am[k], bm[k])...)
		}
		return out
	}
	al, aIsList := a.([]any)
	bl, bIsList := b.([]any)
	if aIsList && bIsList && len(al) == len(bl) {
		var out []string
		for i := range al {
			out = append(out, diffPaths(fmt.Sprintf("%s/%d", at, i), al[i], bl[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{at}
}

func matchesAny(p string, patterns []string) bool {
	for _, pat := range patterns {
		if ok, _ := path.Match(pat, p); ok {
			return true
		}
	}
	return false
}

// valueAt is the value at JSON pointer p in obj, for messages.
func valueAt(obj any, p string) string {
	v := obj
	for _, seg := range strings.Split(p, "/")[1:] {
		seg = strings.NewReplacer("~1", "/", "~0", "~").Replace(seg)
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			var i int
			if _, err := fmt.Sscan(seg, &i); err != nil || i >= len(x) {
				return "absent"
			}
			v = x[i]
		default:
			return "absent"
		}
	}
	return show(v)
}

func show(v any) string {
	if v == nil {
		return "absent"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func keysOf(a, b map[string]any) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func pluginsOf(conf map[string]any) []map[string]any {
	list, _ := conf["plugins"].([]any)
	var out []map[string]any
	for _, p := range list {
		m, _ := p.(map[string]any)
		out = append(out, m)
	}
	return out
}

func typeOf(p map[string]any) string { s, _ := p["type"].(string); return s }

func typesOf(ps []map[string]any) []string {
	var out []string
	for _, p := range ps {
		out = append(out, typeOf(p))
	}
	return out
}

func deepCopy(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// Every overlay renders what its example holds, changed only where the
// rig must (overlays).
func TestOverlaysApplyTheExamples(t *testing.T) {
	dirs, err := os.ReadDir(overlaysDir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		seen[d.Name()] = true
		ov, ok := overlays[d.Name()]
		if !ok {
			t.Errorf("overlay %s: not in this test's overlays: add it, with the example it applies and what it changes", d.Name())
			continue
		}
		if ov.example == "" {
			continue
		}
		t.Run(d.Name(), func(t *testing.T) {
			got, err := renderOverlay(filepath.Join(overlaysDir, d.Name()))
			if err != nil {
				t.Fatal(err)
			}
			example, err := exampleObjects(ov.example)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range overlayChanges(example, got, ov) {
				t.Errorf("%s changes %s beyond what the rig must: %s", d.Name(), ov.example, c)
			}
		})
	}
	for name := range overlays {
		if !seen[name] {
			t.Errorf("overlay %s in this test's overlays, not in %s", name, overlaysDir)
		}
	}
}

// The comparison refuses what an overlay must not change: each case
// changes the rendered nad-rails-shared (the rails sharing a subnet, as
// TestTwoNodes applies them) in one way, and the change must be named.
func TestOverlayComparisonRefuses(t *testing.T) {
	ov := overlays["nad-rails-shared"]
	example, err := exampleObjects(ov.example)
	if err != nil {
		t.Fatal(err)
	}
	rendering := func(t *testing.T) []rendered {
		t.Helper()
		got, err := renderOverlay(filepath.Join(overlaysDir, "nad-rails-shared"))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if c := overlayChanges(example, rendering(t), ov); len(c) != 0 {
		t.Fatalf("the overlay as it is: %v", c)
	}
	// plugin is the first NAD's plugin of type typ, to change in place.
	plugin := func(t *testing.T, got []rendered, typ string, change func(conf map[string]any, p map[string]any)) {
		t.Helper()
		var conf map[string]any
		if err := json.Unmarshal([]byte(configOf(got[0])), &conf); err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		for _, q := range pluginsOf(conf) {
			if typeOf(q) == typ {
				p = q
			}
		}
		if p == nil && typ != "" {
			t.Fatalf("no %s in %s", typ, configOf(got[0]))
		}
		change(conf, p)
		b, err := json.Marshal(conf)
		if err != nil {
			t.Fatal(err)
		}
		got[0].obj["spec"].(map[string]any)["config"] = string(b)
	}
	for _, c := range []struct {
		name   string
		typ    string
		change func(conf, p map[string]any)
		object func(obj map[string]any)
		want   string // in the change named
	}{
		{name: "tuning's arp_ignore 0", typ: "tuning", want: "tuning: sysctl",
			change: func(_, p map[string]any) { p["sysctl"].(map[string]any)["net.ipv4.conf.IFNAME.arp_ignore"] = "0" }},
		{name: "sbr's table set", typ: "sbr", want: "sbr: table",
			change: func(_, p map[string]any) { p["table"] = 100 }},
		{name: "sbr left out", want: "chain [host-device tuning rdma-netns]",
			change: func(conf, _ map[string]any) {
				conf["plugins"] = slices.DeleteFunc(conf["plugins"].([]any), func(p any) bool { return typeOf(p.(map[string]any)) == "sbr" })
			}},
		{name: "tuning and sbr swapped", want: "chain [host-device sbr tuning rdma-netns]",
			change: func(conf, _ map[string]any) {
				l := conf["plugins"].([]any)
				l[1], l[2] = l[2], l[1]
			}},
		{name: "rdma-netns's rdmaQoS added", typ: "rdma-netns", want: "rdma-netns: rdmaQoS",
			change: func(_, p map[string]any) { p["rdmaQoS"] = map[string]any{"tos": 106} }},
		{name: "host-device's NIC by PCI address in place of its name", typ: "host-device", want: "host-device: device",
			change: func(_, p map[string]any) { delete(p, "device"); p["pciBusID"] = "0000:00:06.0" }},
		{name: "host-device's MTU", typ: "host-device", want: "host-device: mtu",
			change: func(_, p map[string]any) { p["mtu"] = 1500 }},
		{name: "host-device's deviceID capability", typ: "host-device", want: "host-device: capabilities",
			change: func(_, p map[string]any) { p["capabilities"].(map[string]any)["deviceID"] = true }},
		{name: "IPAM of another type", typ: "host-device", want: "host-device: ipam",
			change: func(_, p map[string]any) { p["ipam"] = map[string]any{"type": "host-local", "subnet": "10.99.20.0/24"} }},
		{name: "the config's name", want: "config name",
			change: func(conf, _ map[string]any) { conf["name"] = "rdma-shared-railX" }},
		{name: "the config's cniVersion", want: "config cniVersion",
			change: func(conf, _ map[string]any) { conf["cniVersion"] = "0.4.0" }},
		{name: "an annotation on the NAD", want: "/metadata/annotations",
			object: func(obj map[string]any) {
				obj["metadata"].(map[string]any)["annotations"] = map[string]any{"k8s.v1.cni.cncf.io/resourceName": "x/y"}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := rendering(t)
			if c.change != nil {
				plugin(t, got, c.typ, c.change)
			}
			if c.object != nil {
				c.object(got[0].obj)
			}
			changes := overlayChanges(example, got, ov)
			if !slices.ContainsFunc(changes, func(s string) bool { return strings.Contains(s, c.want) }) {
				t.Errorf("changes %q, want one naming %q", changes, c.want)
			}
		})
	}
	// Without the overlay's allowance its rename is refused too.
	strict := ov
	strict.plugins = nil
	if c := overlayChanges(example, rendering(t), strict); len(c) != 2 || !strings.Contains(c[0], "rdma-netns: rdmaDevName") {
		t.Errorf("rdma_s<k> without the allowance: %q, want each NAD's rdmaDevName named", c)
	}
}
