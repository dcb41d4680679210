package conf

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// The multi-rail examples: one NAD per rail, rails named rdma_r<k> on every
// node. nad-rails.yaml is a rail-optimized fabric (a subnet per rail);
// nad-rails-shared-subnet.yaml puts every rail on one subnet and chains
// tuning (per-rail ARP sysctls) and sbr (a routing table per rail) before
// rdma-netns.
var railExamples = []struct {
	file   string
	chain  []string
	shared bool // every rail on one subnet
}{
	{"nad-rails.yaml", []string{"host-device", "rdma-netns"}, false},
	{"nad-rails-shared-subnet.yaml", []string{"host-device", "tuning", "sbr", "rdma-netns"}, true},
}

// railDevName is the uniform pattern: rail k's device is rdma_r<k> in
// every pod, so one NCCL_IB_HCA fits every node.
var railDevName = regexp.MustCompile(`^rdma_r([0-9]+)$`)

// hostDeviceConf is the part of host-device's configuration the examples
// set, with whereabouts's range.
type hostDeviceConf struct {
	Type   string `json:"type"`
	Device string `json:"device"`
	IPAM   struct {
		Type  string `json:"type"`
		Range string `json:"range"`
	} `json:"ipam"`
}

// tuningConf mirrors the keys tuning (containernetworking/plugins v1.10.0,
// plugins/meta/tuning) reads; decoded strictly, a misspelt key ("sysctls")
// fails instead of being ignored by tuning.
type tuningConf struct {
	Type     string            `json:"type"`
	DataDir  string            `json:"dataDir,omitempty"`
	SysCtl   map[string]string `json:"sysctl"`
	Mac      string            `json:"mac,omitempty"`
	Promisc  bool              `json:"promisc,omitempty"`
	Mtu      int               `json:"mtu,omitempty"`
	TxQLen   *int              `json:"txQLen,omitempty"`
	Allmulti *bool             `json:"allmulti,omitempty"`
}

// sbrConf mirrors the keys sbr v1.10.0 (plugins/meta/sbr) reads.
type sbrConf struct {
	Type           string   `json:"type"`
	Table          *int     `json:"table,omitempty"`
	Gateways       []string `json:"gateways,omitempty"`
	AddSourceHints bool     `json:"addSourceHints,omitempty"`
}

// tuningSysctlFile is the file tuning v1.10.0 writes for a sysctl key on
// the attachment ifName (getSysctlFilename): dots become slashes, the
// first IFNAME becomes CNI_IFNAME, and the result must be under
// /proc/sys/net/. Nothing ties a literal interface name in the key to the
// attachment: only IFNAME follows it.
func tuningSysctlFile(key, ifName string) (string, error) {
	key = strings.ReplaceAll(key, ".", "/")
	key = strings.Replace(key, "IFNAME", ifName, 1)
	f := filepath.Join("/proc/sys", key)
	if !strings.HasPrefix(f, "/proc/sys/net/") {
		return "", fmt.Errorf("invalid net sysctl key: %q", key)
	}
	return f, nil
}

// rail is one NAD of a rails example, read.
type rail struct {
	nad    string
	conf   []byte
	list   *libcni.NetworkConfigList
	types  []string
	host   hostDeviceConf
	rdma   *config.NetConf
	devIdx int // k of rdma_r<k>
}

// mustDecodeFile reads and decodes a manifest file of conf/, failing t
// when it cannot.
func mustDecodeFile(t *testing.T, file string) []object {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(file, data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func loadRails(t *testing.T, file string) []rail {
	t.Helper()
	objs := mustDecodeFile(t, file)
	var rails []rail
	for _, o := range objs {
		nad, ok := o.obj.(*networkAttachmentDefinition)
		if !ok {
			t.Fatalf("%s: a %s; the rails examples hold NADs only", o.where, o.kind)
		}
		r := rail{nad: nad.Name, conf: []byte(nad.Spec.Config)}
		if err := checkChain(r.conf, nad.Name, ""); err != nil {
			t.Fatalf("%s: %v", o.where, err)
		}
		var err error
		if r.list, err = libcni.NetworkConfFromBytes(r.conf); err != nil {
			t.Fatal(err)
		}
		for _, p := range r.list.Plugins {
			r.types = append(r.types, p.Network.Type)
			switch p.Network.Type {
			case "host-device":
				if err := strictInto(p.Bytes, &r.host); err != nil {
					t.Fatalf("%s: host-device: %v", o.where, err)
				}
			case "rdma-netns":
				// As libcni sends it: the list's name and cniVersion.
				sent, err := libcni.InjectConf(p, map[string]any{"name": r.list.Name, "cniVersion": r.list.CNIVersion})
				if err != nil {
					t.Fatal(err)
				}
				if r.rdma, err = config.ParseSettings(sent.Bytes, ""); err != nil {
					t.Fatalf("%s: rdma-netns refuses its entry: %v", o.where, err)
				}
			}
		}
		rails = append(rails, r)
	}
	return rails
}

func strictInto(raw []byte, v any) error {
	strictErrs, err := sigsjson.UnmarshalStrict(raw, v)
	if err != nil || len(strictErrs) > 0 {
		return errors.Join(append(strictErrs, err)...)
	}
	return nil
}

func TestRailsExamples(t *testing.T) {
	for _, ex := range railExamples {
		t.Run(ex.file, func(t *testing.T) {
			rails := loadRails(t, ex.file)
			if len(rails) < 2 {
				t.Fatalf("%d NADs, want one per rail and at least two rails", len(rails))
			}
			devices := map[string]string{}
			ranges := map[string]string{}
			for k, r := range rails {
				if !slices.Equal(r.types, ex.chain) {
					t.Errorf("%s: chain %v, want %v", r.nad, r.types, ex.chain)
				}
				if !strings.HasSuffix(r.nad, "rail"+strconv.Itoa(k)) {
					t.Errorf("NAD %d is %s, want its name to end in rail%d (the rails in order)", k, r.nad, k)
				}
				m := railDevName.FindStringSubmatch(r.rdma.RdmaDevName)
				if m == nil || m[1] != strconv.Itoa(k) {
					t.Errorf("%s: rdmaDevName %q, want rdma_r%d (rail k is rdma_r<k> on every node)", r.nad, r.rdma.RdmaDevName, k)
				}
				if r.rdma.PodRdmaDevNamePrefix != "" || r.rdma.DeviceID != "" {
					t.Errorf("%s: the rails' devices are named by the NAD and found behind the NIC: no pod prefix or deviceID", r.nad)
				}
				if r.host.Device == "" || r.host.IPAM.Type != "whereabouts" {
					t.Errorf("%s: host-device %+v, want a NIC by name and whereabouts IPAM", r.nad, r.host)
				}
				if other, dup := devices[r.host.Device]; dup {
					t.Errorf("%s and %s both move NIC %s", other, r.nad, r.host.Device)
				}
				devices[r.host.Device] = r.nad
				p, err := netip.ParsePrefix(r.host.IPAM.Range)
				if err != nil || !p.Addr().Is4() {
					t.Errorf("%s: range %q is not an IPv4 prefix (RoCE v2 GIDs for IPv4 addresses): %v", r.nad, r.host.IPAM.Range, err)
					continue
				}
				for other, q := range ranges {
					op := netip.MustParsePrefix(q)
					if ex.shared && p != op {
						t.Errorf("%s: range %s, %s has %s: the shared-subnet rails take one range (one whereabouts pool)", r.nad, p, other, op)
					}
					if !ex.shared && p.Overlaps(op) {
						t.Errorf("%s: range %s overlaps %s's %s: a rail-optimized fabric has a subnet per rail", r.nad, p, other, op)
					}
				}
				ranges[r.nad] = p.String()
				if ex.shared {
					if err := checkSharedRail(r.list, "net"+strconv.Itoa(k+1)); err != nil {
						t.Errorf("%s: %v", r.nad, err)
					}
				}
			}
			checkRailsPod(t, ex.file, rails)
			checkRailsDoctor(t, ex.file)
		})
	}
}

// checkSharedRail checks a shared-subnet rail's chain for its attachment
// ifName: tuning sets arp_ignore 1 and arp_announce 2 for that netdev (and
// would for any name Multus gives it), then sbr with a table of its own
// per rail, both after host-device and before rdma-netns.
func checkSharedRail(list *libcni.NetworkConfigList, ifName string) error {
	pos := map[string]int{}
	for i, p := range list.Plugins {
		if _, dup := pos[p.Network.Type]; dup {
			return fmt.Errorf("%s twice in the chain", p.Network.Type)
		}
		pos[p.Network.Type] = i
	}
	for _, typ := range []string{"host-device", "tuning", "sbr", "rdma-netns"} {
		if _, ok := pos[typ]; !ok {
			return fmt.Errorf("no %s in the chain", typ)
		}
	}
	if !(pos["host-device"] < pos["tuning"] && pos["tuning"] < pos["rdma-netns"] && pos["host-device"] < pos["sbr"] && pos["sbr"] < pos["rdma-netns"]) {
		var types []string
		for _, p := range list.Plugins {
			types = append(types, p.Network.Type)
		}
		return fmt.Errorf("chain order %v: tuning and sbr act on the netdev host-device moved in, and come before rdma-netns", types)
	}
	if err := checkARPTuning(list.Plugins[pos["tuning"]].Bytes, ifName); err != nil {
		return err
	}
	var sc sbrConf
	if err := strictInto(list.Plugins[pos["sbr"]].Bytes, &sc); err != nil {
		return fmt.Errorf("sbr: %w", err)
	}
	if sc.Table != nil {
		return fmt.Errorf("sbr: table %d: with a table sbr only adds the rule, and moves no route into it; leave it unset for a table per rail", *sc.Table)
	}
	return nil
}

// checkARPTuning: tuning's entry sets arp_ignore 1 and arp_announce 2 on
// the attachment ifName, and would on whatever name Multus gives it.
func checkARPTuning(raw []byte, ifName string) error {
	var tc tuningConf
	if err := strictInto(raw, &tc); err != nil {
		return fmt.Errorf("tuning: %w", err)
	}
	want := map[string]string{
		"/proc/sys/net/ipv4/conf/" + ifName + "/arp_ignore":   "1",
		"/proc/sys/net/ipv4/conf/" + ifName + "/arp_announce": "2",
	}
	got := map[string]string{}
	for key, v := range tc.SysCtl {
		f, err := tuningSysctlFile(key, ifName)
		if err != nil {
			return fmt.Errorf("tuning: %w", err)
		}
		got[f] = v
		// The same NAD on another attachment name (the pod's "interface",
		// or its position in the annotation) must follow it.
		if other, _ := tuningSysctlFile(key, "rail7"); !strings.Contains(other, "/rail7/") {
			return fmt.Errorf("tuning: sysctl %s names its netdev literally: on an attachment not called so it writes %s; use IFNAME", key, f)
		}
	}
	for f, v := range want {
		if got[f] != v {
			return fmt.Errorf("tuning: on %s writes %v, want %s = %s", ifName, got, f, v)
		}
	}
	return nil
}

// railsPod is the pod snippet of a rails example: the comment lines after
// "#   apiVersion: v1", dedented.
func railsPod(file string) (*corev1.Pod, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var doc []string
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case doc == nil && l == "#   apiVersion: v1":
			doc = []string{"apiVersion: v1"}
		case doc != nil && strings.HasPrefix(l, "#   "):
			doc = append(doc, strings.TrimPrefix(l, "#   "))
		case doc != nil:
			o, err := decodeStrict([]byte(strings.Join(doc, "\n")))
			if err != nil {
				return nil, fmt.Errorf("the pod in the comment: %w", err)
			}
			pod, ok := o.obj.(*corev1.Pod)
			if !ok {
				return nil, fmt.Errorf("the comment's object is a %s, not a Pod", o.kind)
			}
			return pod, nil
		}
	}
	return nil, errors.New(`no pod in the comments (a block starting "#   apiVersion: v1")`)
}

// checkRailsPod: the example pod attaches every rail of the file in order,
// its NCCL_IB_HCA and UCX_NET_DEVICES list every rail's device, and
// UCX's rail counts allow every one.
func checkRailsPod(t *testing.T, file string, rails []rail) {
	t.Helper()
	pod, err := railsPod(file)
	if err != nil {
		t.Fatal(err)
	}
	var sel []struct {
		Name      string `json:"name"`
		Interface string `json:"interface"`
	}
	if err := json.Unmarshal([]byte(pod.Annotations["k8s.v1.cni.cncf.io/networks"]), &sel); err != nil {
		t.Fatalf("the pod's networks annotation: %v", err)
	}
	var nets, devs, ucx []string
	for i, s := range sel {
		nets = append(nets, s.Name)
		// Multus's name for it: the element's interface, else net<i+1>.
		if s.Interface != "" && s.Interface != "net"+strconv.Itoa(i+1) {
			t.Errorf("the pod names rail %d %s; the test checks the sysctls on net%d", i, s.Interface, i+1)
		}
	}
	for _, r := range rails {
		devs = append(devs, r.rdma.RdmaDevName)
		ucx = append(ucx, r.rdma.RdmaDevName+":1")
	}
	var railNADs []string
	for _, r := range rails {
		railNADs = append(railNADs, r.nad)
	}
	if !slices.Equal(nets, railNADs) {
		t.Errorf("the pod attaches %v, want every rail in order %v", nets, railNADs)
	}
	env := map[string]string{}
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
	}
	if hca := strings.Split(strings.TrimPrefix(env["NCCL_IB_HCA"], "="), ","); !slices.Equal(hca, devs) {
		t.Errorf("NCCL_IB_HCA %q, want every rail: %v", env["NCCL_IB_HCA"], devs)
	}
	if got := strings.Split(env["UCX_NET_DEVICES"], ","); !slices.Equal(got, ucx) {
		t.Errorf("UCX_NET_DEVICES %q, want %v", env["UCX_NET_DEVICES"], ucx)
	}
	// At UCX's defaults (1 and 2) an allreduce used the first rail alone
	// (make bench-nodes's TestBenchRailsUCX).
	for _, v := range []string{"UCX_MAX_EAGER_RAILS", "UCX_MAX_RNDV_RAILS"} {
		if env[v] != strconv.Itoa(len(rails)) {
			t.Errorf("%s %q, want %d: every rail, not UCX's default", v, env[v], len(rails))
		}
	}
}

// checkRailsDoctor: `rdma-netns doctor nads` finds nothing to warn about in
// the example, as kubectl would print its NADs.
func checkRailsDoctor(t *testing.T, file string) {
	t.Helper()
	objs := mustDecodeFile(t, file)
	var items []any
	for _, o := range objs {
		nad := o.obj.(*networkAttachmentDefinition)
		nad.Namespace = "ml"
		items = append(items, nad)
	}
	list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	r := doctor.CheckNADs(strings.NewReader(string(list)))
	if r.ExitCode != 0 || r.Summary[doctor.Warn] != 0 || r.NADs == nil || len(r.NADs.WithRdmaNetns) != len(objs) {
		t.Errorf("doctor nads on %s: exit %d, %v, findings %+v, view %+v", file, r.ExitCode, r.Summary, r.Findings, r.NADs)
	}
}

// The doctor's rails check names the shared-subnet example as the fix.
func TestRailsNADNamedByDoctor(t *testing.T) {
	file, ok := strings.CutPrefix(doctor.RailsNAD, "conf/")
	if !ok {
		t.Fatalf("doctor.RailsNAD %q is not under conf/", doctor.RailsNAD)
	}
	for _, ex := range railExamples {
		if ex.file == file && ex.shared {
			return
		}
	}
	t.Errorf("doctor.RailsNAD %q is not the shared-subnet rails example this test checks", doctor.RailsNAD)
}

// checkSharedRail must refuse what would let rails cross.
func TestSharedRailRejects(t *testing.T) {
	const ok = `{"cniVersion": "1.1.0", "name": "r", "plugins": [
		{"type": "host-device", "device": "ens1f0np0"},
		{"type": "tuning", "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1", "net.ipv4.conf.IFNAME.arp_announce": "2"}},
		{"type": "sbr"},
		{"type": "rdma-netns", "rdmaDevName": "rdma_r0"}]}`
	for _, tc := range []struct{ name, conf, want string }{
		{"valid baseline", ok, ""},
		{"literal interface name", strings.ReplaceAll(ok, "IFNAME", "net1"), "names its netdev literally"},
		{"another rail's interface", strings.ReplaceAll(ok, "IFNAME", "net2"), "names its netdev literally"},
		{"arp_announce missing", strings.Replace(ok, `, "net.ipv4.conf.IFNAME.arp_announce": "2"`, "", 1), "arp_announce"},
		{"arp_ignore 0", strings.Replace(ok, `arp_ignore": "1"`, `arp_ignore": "0"`, 1), "arp_ignore"},
		{"misspelt sysctl key", strings.Replace(ok, `"sysctl"`, `"sysctls"`, 1), `unknown field "sysctls"`},
		{"sysctl outside net", strings.Replace(ok, "net.ipv4.conf.IFNAME.arp_ignore", "kernel.IFNAME", 1), "invalid net sysctl key"},
		{"sbr with a fixed table", strings.Replace(ok, `{"type": "sbr"}`, `{"type": "sbr", "table": 100}`, 1), "table 100"},
		{"sbr key misspelt", strings.Replace(ok, `{"type": "sbr"}`, `{"type": "sbr", "addSourceHint": true}`, 1), `unknown field "addSourceHint"`},
		{"sbr after rdma-netns", strings.Replace(strings.Replace(ok, `{"type": "sbr"},`, "", 1), `"rdma_r0"}`, `"rdma_r0"}, {"type": "sbr"}`, 1), "chain order"},
		{"no sbr", strings.Replace(ok, `{"type": "sbr"},`, "", 1), "no sbr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list, err := libcni.NetworkConfFromBytes([]byte(tc.conf))
			if err != nil {
				t.Fatal(err)
			}
			wantRejection(t, "valid chain", checkSharedRail(list, "net1"), tc.want)
		})
	}
}
