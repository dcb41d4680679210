package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// pod is a real, empty network namespace standing in for a pod sandbox.
type pod struct {
	ns     ns.NetNS
	id     string
	ifName string
}

func (p pod) path() string { return p.ns.Path() }

// newPod creates a netns whose netdev ifName has the given parent device,
// as host-device would leave it.
func (e *env) newPod(id, ifName, bus, parent string) pod {
	e.t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		e.t.Fatalf("create netns: %v", err)
	}
	e.t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	if parent != "" || bus != "" {
		e.kernel.addNetdev(fakeNetdev{netns: n.Path(), name: ifName, bus: bus, parent: parent})
	}
	return pod{ns: n, id: id, ifName: ifName}
}

// deleteNetns destroys the pod netns as the runtime does on teardown.
func (e *env) deleteNetns(p pod) {
	e.t.Helper()
	p.ns.Close()
	if err := testutils.UnmountNS(p.ns); err != nil {
		e.t.Fatal(err)
	}
	e.kernel.destroy(p.path())
}

// netconf is the plugin's config as libcni hands it over after host-device.
func (e *env) netconf(p pod, version string, extra map[string]any) []byte {
	e.t.Helper()
	conf := map[string]any{
		"cniVersion": version,
		"name":       "rdma-net",
		"type":       "rdma-netns",
		"prevResult": map[string]any{
			"cniVersion": version,
			"interfaces": []map[string]any{{"name": p.ifName, "sandbox": p.path(), "mac": "02:00:00:00:00:01"}},
			"ips":        []map[string]any{{"address": "10.100.100.2/29", "interface": 0}},
		},
	}
	if strings.HasPrefix(version, "0.3") {
		conf["prevResult"].(map[string]any)["ips"].([]map[string]any)[0]["version"] = "4"
	}
	for k, v := range extra {
		if v == nil {
			delete(conf, k)
		} else {
			conf[k] = v
		}
	}
	b, err := json.Marshal(conf)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) args(p pod, conf []byte, cniArgs string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: p.id, Netns: p.path(), IfName: p.ifName, Args: cniArgs, StdinData: conf}
}

func (e *env) add(p pod, conf []byte, cniArgs string) (types.Result, error) {
	a := e.args(p, conf, cniArgs)
	r, _, err := testutils.CmdAddWithArgs(a, func() error { return e.plugin.Add(a) })
	return r, err
}

func (e *env) del(p pod, conf []byte) error {
	a := e.args(p, conf, "")
	return testutils.CmdDelWithArgs(a, func() error { return e.plugin.Del(a) })
}

func (e *env) check(p pod, conf []byte) error {
	a := e.args(p, conf, "")
	return testutils.CmdCheckWithArgs(a, func() error { return e.plugin.Check(a) })
}

func (e *env) records() []*state.Record {
	e.t.Helper()
	st, err := state.New(e.stateDir)
	if err != nil {
		e.t.Fatal(err)
	}
	recs, err := st.List()
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

func (e *env) wantWhere(dev, where string) {
	e.t.Helper()
	if got := e.kernel.location(dev); got != where {
		e.t.Fatalf("RDMA device %s is in %s, want %s\nlog:\n%s", dev, got, where, e.log)
	}
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error mentioning %q, got success", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not mention %q", err, p)
		}
	}
}

// The seed case: host-device moved eth1 into the pod as net1; ADD finds
// rxe1 under the PCI function enclosing virtio1 and moves it; DEL returns it.
func TestAddDelByNetdevParent(t *testing.T) {
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			conf := e.netconf(p, v, nil)
			res, err := e.add(p, conf, "")
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			e.wantWhere("rxe1", p.path())
			e.wantWhere("rxe2", "host")
			got, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Interfaces) != 1 || got.Interfaces[0].Name != "net1" || got.Interfaces[0].Sandbox != p.path() || len(got.IPs) != 1 {
				t.Fatalf("result does not pass prevResult through: %+v", got)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			recs := e.records()
			if len(recs) != 1 || recs[0].Device != "rxe1" || recs[0].State != state.StateAttached || recs[0].PCIAddress != "0000:00:04.0" {
				t.Fatalf("records = %+v", recs)
			}
			if !strings.Contains(e.log.String(), "resolved RDMA device rxe1 by netdev net1 (parent virtio/virtio1)") {
				t.Fatalf("log does not say which rule matched:\n%s", e.log)
			}
			if err := e.del(p, conf); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.wantWhere("rxe1", "host")
			if recs := e.records(); len(recs) != 0 {
				t.Fatalf("records left after DEL: %+v", recs)
			}
		})
	}
}

// The device's kernel index from its last move is kept in its lock file and
// offered to the next move as a hint; a lost or damaged one costs nothing
// but the lookup it would have spared.
func TestAddKeepsDeviceIndexHint(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	st, err := state.New(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	lockFile := st.DeviceLockPath("rxe1")
	addDel := func(when string) {
		t.Helper()
		if _, err := e.add(p, conf, ""); err != nil {
			t.Fatalf("ADD %s: %v", when, err)
		}
		e.wantWhere("rxe1", p.path())
		if err := e.del(p, conf); err != nil {
			t.Fatalf("DEL %s: %v", when, err)
		}
		e.wantWhere("rxe1", "host")
	}
	addDel("first")
	want := fmt.Sprintf("%d\n", e.kernel.indexOf("rxe1"))
	if b, err := os.ReadFile(lockFile); err != nil || string(b) != want {
		t.Fatalf("lock file of rxe1 holds %q (%v), want the index %q", b, err, want)
	}
	if e.kernel.hinted != 0 {
		t.Fatalf("first move had a hint")
	}
	addDel("second")
	if e.kernel.hinted != 1 {
		t.Fatalf("second move was not given the kept index (hinted %d)", e.kernel.hinted)
	}
	for _, damaged := range []string{"garbage\n", "", "99999999999\n", "-3\n"} {
		if err := os.WriteFile(lockFile, []byte(damaged), 0o600); err != nil {
			t.Fatal(err)
		}
		addDel(fmt.Sprintf("with %q in the lock file", damaged))
		if b, _ := os.ReadFile(lockFile); string(b) != want {
			t.Fatalf("after a move with %q kept, the lock file holds %q, want %q", damaged, b, want)
		}
	}
	if e.kernel.hinted != 1 {
		t.Fatalf("a damaged index was taken as a hint (hinted %d)", e.kernel.hinted)
	}
}

// Each real layout resolves to its own device.
func TestResolveLayouts(t *testing.T) {
	cases := []struct {
		name, bus, parent, want string
	}{
		{"virtio child layout", "virtio", "virtio2", "rxe2"},
		{"mlx5 PF", "pci", "0000:3b:00.0", "mlx5_0"},
		{"mlx5 sub-function", "auxiliary", "mlx5_core.sf.2", "mlx5_2"},
		{"E810 irdma udev name", "pci", "0000:47:00.0", "rocep71s0f0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", tc.bus, tc.parent)
			if _, err := e.add(p, e.netconf(p, "1.1.0", nil), ""); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			e.wantWhere(tc.want, p.path())
			if e.kernel.moves != 1 {
				t.Fatalf("%d moves, want 1: %s", e.kernel.moves, e.kernel.snapshot())
			}
		})
	}
}

// An SF whose own device is gone must not take its PF's device.
func TestSubFunctionNeverTakesPFDevice(t *testing.T) {
	e := newEnv(t)
	e.tree.Remove("infiniband", "mlx5_2")
	delete(e.kernel.where, "mlx5_2")
	p := e.newPod("c1", "net1", "auxiliary", "mlx5_core.sf.2")
	_, err := e.add(p, e.netconf(p, "1.1.0", nil), "")
	wantErr(t, err, "no RDMA device found", "mlx5_core.sf.2")
	e.wantWhere("mlx5_0", "host")
}

// Explicit names and device IDs, in their order of precedence.
func TestResolutionOrder(t *testing.T) {
	cases := []struct {
		name    string
		extra   map[string]any
		cniArgs string
		want    string
		rule    string
	}{
		{"rdmaDevice", map[string]any{"rdmaDevice": "mlx5_0"}, "", "mlx5_0", "by rdmaDevice"},
		{"rdmaDevice wins over deviceID", map[string]any{"rdmaDevice": "rxe2", "deviceID": "0000:3b:00.0"}, "", "rxe2", "by rdmaDevice"},
		// A device plugin's allocation, as Multus hands it to every plugin
		// of the chain: in deviceID, pciBusID and runtimeConfig.deviceID.
		{"device plugin's deviceID", map[string]any{"runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}, "deviceID": "0000:3b:00.0", "pciBusID": "0000:3b:00.0"}, "", "mlx5_0", "runtimeConfig.deviceID 0000:3b:00.0"},
		// A pod's own choice that names the device the network gives it.
		{"CNI_ARGS naming the network's device", map[string]any{"rdmaDevice": "mlx5_0"}, "IgnoreUnknown=1;K8S_POD_NAME=x;rdmaDevice=mlx5_0", "mlx5_0", "by rdmaDevice"},
		{"top-level deviceID", map[string]any{"deviceID": "47:00.0"}, "", "rocep71s0f0", "deviceID 47:00.0"},
		{"pciBusID", map[string]any{"pciBusID": "0000:00:05.0"}, "", "rxe2", "pciBusID 0000:00:05.0"},
		{"auxiliary device ID", map[string]any{"deviceID": "mlx5_core.sf.2"}, "", "mlx5_2", "deviceID mlx5_core.sf.2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// The pod netdev's parent points elsewhere (rxe1): the explicit
			// settings must win over the netdev rule.
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			if _, err := e.add(p, e.netconf(p, "1.1.0", tc.extra), tc.cniArgs); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			e.wantWhere(tc.want, p.path())
			e.wantWhere("rxe1", "host")
			if !strings.Contains(e.log.String(), tc.rule) {
				t.Fatalf("log does not name rule %q:\n%s", tc.rule, e.log)
			}
		})
	}
}

// Errors that must leave everything as it was.
func TestAddRefusals(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(e *env, p pod)
		extra   map[string]any
		cniArgs string
		want    []string
	}{
		{name: "no prevResult", extra: map[string]any{"prevResult": nil}, want: []string{"needs a prevResult", "meta-plugin"}},
		{name: "shared mode", setup: func(e *env, _ pod) { e.kernel.mode = "shared" },
			want: []string{"shared netns mode", "options ib_core netns_mode=0", "rdma system set netns exclusive", "allowSharedMode"}},
		{name: "no RDMA subsystem", setup: func(e *env, _ pod) { e.kernel.modeErr = errors.New("protocol not supported") },
			want: []string{"cannot read the RDMA netns mode", "ib_core"}},
		{name: "veth without parent", setup: func(e *env, p pod) { l := e.kernel.link(p.path(), p.ifName); l.bus, l.parent = "", "" },
			want: []string{"netdev net1", "no parent device", "rdmaDevice"}},
		{name: "netdev without RDMA device", setup: func(e *env, _ pod) {
			e.tree.PCI("pci0000:00/0000:00:06.0")
			e.tree.Device("virtio", "pci0000:00/0000:00:06.0/virtio3")
		}, extra: map[string]any{"deviceID": "0000:00:06.0"}, want: []string{"no RDMA device found", "0000:00:06.0", "node's log"}},
		{name: "ambiguous", setup: func(e *env, _ pod) {
			e.tree.RDMA(vFn1, "rxe9")
			e.kernel.where["rxe9"] = ""
		}, want: []string{"equally close", "rxe1", "rxe9", "rdmaDevice"}},
		{name: "unknown rdmaDevice", extra: map[string]any{"rdmaDevice": "mlx5_9"}, want: []string{"mlx5_9", "not in the host network namespace", "node's log"}},
		{name: "bad rdmaDevice", extra: map[string]any{"rdmaDevice": "../etc"}, want: []string{"rdmaDevice", "not a valid RDMA device name"}},
		{name: "bad deviceID", extra: map[string]any{"deviceID": "0000:99:00.0"}, want: []string{"deviceID", "0000:99:00.0"}},
		{name: "traversal in deviceID", extra: map[string]any{"deviceID": "../../etc"}, want: []string{"deviceID", "not a PCI address"}},
		{name: "unsupported version", extra: map[string]any{"cniVersion": "0.2.0"}, want: []string{"0.2.0", "not supported"}},
		{name: "relative stateDir", extra: map[string]any{"stateDir": "state"}, want: []string{"stateDir", "absolute"}},
		{name: "stateDir of the network's own", extra: map[string]any{"stateDir": "/etc/cron.d"}, want: []string{"stateDir", `"/etc/cron.d"`, config.DefaultStateDir, "nothing was changed"}},
		{name: "bad log level", extra: map[string]any{"logLevel": "loud"}, want: []string{"logLevel"}},
		{name: "tos out of range", extra: map[string]any{"rdmaQoS": map[string]any{"tos": 300}}, want: []string{"rdmaQoS.tos", "0-255"}},
		{name: "move fails", setup: func(e *env, _ pod) { e.kernel.failMoveIn = errors.New("operation not supported") }, want: []string{"operation not supported"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			if tc.setup != nil {
				tc.setup(e, p)
			}
			before := e.kernel.snapshot()
			_, err := e.add(p, e.netconf(p, "1.1.0", tc.extra), tc.cniArgs)
			wantErr(t, err, tc.want...)
			if after := e.kernel.snapshot(); after != before {
				t.Fatalf("devices changed: %s -> %s", before, after)
			}
			if recs := e.records(); len(recs) != 0 {
				t.Fatalf("records left: %+v", recs)
			}
		})
	}
}

// A runtime handing the plugin its own netns as the pod's is refused before
// anything moves (the CNI library's skel would refuse it only afterwards).
func TestAddRefusesOwnNetns(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	before := e.kernel.snapshot()
	a := e.args(p, e.netconf(p, "1.1.0", nil), "")
	a.Netns = "/proc/self/ns/net"
	err := e.plugin.Add(a)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidNetNS {
		t.Fatalf("ADD into the plugin's own netns: %v, want CNI error %d", err, types.ErrInvalidNetNS)
	}
	if after := e.kernel.snapshot(); after != before {
		t.Fatalf("devices changed: %s -> %s", before, after)
	}
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

func TestBadContainerIDChangesNothing(t *testing.T) {
	for _, id := range []string{"../../etc/passwd", "a/b", "x\x00y", strings.Repeat("a", 300)} {
		e := newEnv(t)
		p := e.newPod(id, "net1", "virtio", "virtio1")
		_, err := e.add(p, e.netconf(p, "1.1.0", nil), "")
		if err == nil {
			t.Fatalf("container ID %q accepted", id)
		}
		e.wantWhere("rxe1", "host")
		entries, _ := os.ReadDir(e.stateDir)
		for _, en := range entries {
			if strings.Contains(en.Name(), "passwd") {
				t.Fatalf("state file %s created", en.Name())
			}
		}
	}
}

func TestSharedModePassthrough(t *testing.T) {
	e := newEnv(t)
	e.kernel.mode = "shared"
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	res, err := e.add(p, e.netconf(p, "1.0.0", map[string]any{"allowSharedMode": true}), "")
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if r, _ := current.NewResultFromResult(res); len(r.Interfaces) != 1 {
		t.Fatalf("result not passed through: %+v", res)
	}
	e.wantWhere("rxe1", "host")
	if !strings.Contains(e.log.String(), "allowSharedMode") {
		t.Fatalf("no warning logged:\n%s", e.log)
	}
}

func TestRepeatedAddIsIdempotent(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	for i := 0; i < 2; i++ {
		if _, err := e.add(p, conf, ""); err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
	}
	e.wantWhere("rxe1", p.path())
	if e.kernel.moves != 1 {
		t.Fatalf("%d moves for two ADDs, want 1", e.kernel.moves)
	}
	for i := 0; i < 2; i++ {
		if err := e.del(p, conf); err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
	}
	e.wantWhere("rxe1", "host")
}

func TestDeviceOwnedByAnotherPod(t *testing.T) {
	e := newEnv(t)
	a := e.newPod("pod-a", "net1", "virtio", "virtio1")
	if _, err := e.add(a, e.netconf(a, "1.1.0", nil), "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0"); err != nil {
		t.Fatal(err)
	}
	b := e.newPod("pod-b", "net1", "virtio", "virtio1")
	for _, tc := range []struct {
		extra map[string]any
		args  string
	}{{nil, ""}, {map[string]any{"rdmaDevice": "rxe1"}, ""}, {nil, "rdmaDevice=rxe1"}, {map[string]any{"deviceID": "0000:00:04.0"}, ""}} {
		before := e.kernel.snapshot()
		_, err := e.add(b, e.netconf(b, "1.1.0", tc.extra), "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-1;"+tc.args)
		// Within its namespace the holder is named by its pod's
		// namespace/name, sandbox and netns.
		wantErr(t, err, "rxe1", "held by pod ml/trainer-0", "rdma-net/pod-a/net1", a.path(), "nothing was changed", "Delete the pod that holds it")
		if e.kernel.snapshot() != before {
			t.Fatal("devices changed")
		}
	}
	if recs := e.records(); len(recs) != 1 || recs[0].ContainerID != "pod-a" {
		t.Fatalf("records = %+v", recs)
	}
}

// A pod of another namespace learns that the device is held, and nothing
// about the pod that holds it; the node's log says who.
func TestDeviceOwnedByAnotherTenant(t *testing.T) {
	e := newEnv(t)
	a := e.newPod("pod-a", "net1", "virtio", "virtio1")
	if _, err := e.add(a, e.netconf(a, "1.1.0", nil), "K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=trainer-0"); err != nil {
		t.Fatal(err)
	}
	b := e.newPod("pod-b", "net1", "virtio", "virtio1")
	for _, tc := range []struct {
		extra map[string]any
		args  string
	}{{nil, ""}, {map[string]any{"rdmaDevice": "rxe1"}, ""}, {map[string]any{"deviceID": "0000:00:04.0"}, ""}, {map[string]any{"rdmaDevName": "rxe1"}, ""}} {
		e.log.Reset()
		_, err := e.add(b, e.netconf(b, "1.1.0", tc.extra), "K8S_POD_NAMESPACE=team-b;K8S_POD_NAME=job-0")
		if err == nil {
			t.Fatalf("ADD %v succeeded", tc.extra)
		}
		for _, secret := range []string{"team-a", "trainer-0", "pod-a", a.path()} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error names %q of the other tenant's pod: %v", secret, err)
			}
		}
		if !strings.Contains(err.Error(), "a pod in another namespace") {
			t.Errorf("error does not say another namespace's pod holds it: %v", err)
		}
		if !strings.Contains(e.log.String(), "pod team-a/trainer-0") {
			t.Errorf("the node's log does not name the holder:\n%s", e.log)
		}
	}
	e.wantWhere("rxe1", a.path())
}

// Two pods racing for one device: exactly one wins.
func TestConcurrentAddsForOneDevice(t *testing.T) {
	e := newEnv(t)
	var pods []pod
	for i := 0; i < 6; i++ {
		pods = append(pods, e.newPod(fmt.Sprintf("pod-%d", i), "net1", "virtio", "virtio1"))
	}
	errs := make(chan error, len(pods))
	for _, p := range pods {
		go func(p pod) {
			a := e.args(p, e.netconf(p, "1.1.0", map[string]any{"rdmaDevice": "rxe1"}), "")
			quiet := *e.plugin
			quiet.Out = io.Discard
			errs <- quiet.Add(a)
		}(p)
	}
	wins := 0
	for range pods {
		if err := <-errs; err == nil {
			wins++
		} else if !strings.Contains(err.Error(), "rxe1") {
			t.Errorf("loser's error does not name the device: %v", err)
		}
	}
	if wins != 1 || e.kernel.moves != 1 || len(e.records()) != 1 {
		t.Fatalf("%d winners, %d moves, %d records; want 1 each", wins, e.kernel.moves, len(e.records()))
	}
}

func TestRollbackWhenStateCannotBeWritten(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	// The state directory disappears under us after the move (disk
	// failure, operator error): the device must go back.
	e.kernel.afterMoveIn = func() {
		os.RemoveAll(e.stateDir)
		os.WriteFile(e.stateDir, []byte("not a dir"), 0o600)
	}
	_, err := e.add(p, e.netconf(p, "1.1.0", nil), "")
	wantErr(t, err, "cannot record the attachment of RDMA device rxe1")
	e.wantWhere("rxe1", "host")
}

func TestRollbackWhenDeviceInfoFails(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	bad := filepath.Join(t.TempDir(), "is-a-dir")
	os.Mkdir(bad, 0o755)
	_, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"runtimeConfig": map[string]any{"CNIDeviceInfoFile": bad}}), "")
	wantErr(t, err, "device-info file", bad)
	e.wantWhere("rxe1", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

func TestDeviceInfoFile(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	path := filepath.Join(t.TempDir(), "devinfo", "rdma-net-net1.json")
	if _, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"runtimeConfig": map[string]any{"CNIDeviceInfoFile": path}}), ""); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Type    string `json:"type"`
		Version string `json:"version"`
		PCI     struct {
			Address string `json:"pci-address"`
			RDMA    string `json:"rdma-device"`
		} `json:"pci"`
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Type != "pci" || doc.Version != "1.1.0" || doc.PCI.Address != "0000:00:04.0" || doc.PCI.RDMA != "rxe1" {
		t.Fatalf("device info = %s", data)
	}
}

func TestDeviceInfoFileExtendsDevicePluginEntry(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "pci", "0000:3b:00.0")
	path := filepath.Join(t.TempDir(), "dev.json")
	os.WriteFile(path, []byte(`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:00.0","pf-pci-address":"0000:3b:00.0","vhost-net":""}}`), 0o644)
	if _, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"runtimeConfig": map[string]any{"CNIDeviceInfoFile": path}}), ""); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	for _, want := range []string{`"rdma-device":"mlx5_0"`, `"pf-pci-address":"0000:3b:00.0"`, `"vhost-net":""`} {
		if !strings.Contains(string(data), want) {
			t.Fatalf("device info %s lacks %s", data, want)
		}
	}
}

func TestDelCases(t *testing.T) {
	cases := []struct {
		name   string
		before func(e *env, p pod) pod
		want   string // where rxe1 ends up
	}{
		{"netns deleted", func(e *env, p pod) pod { e.deleteNetns(p); return p }, "host"},
		{"empty CNI_NETNS", func(e *env, p pod) pod { p2 := p; p2.ns = emptyNS{}; return p2 }, ""},
		{"device already back", func(e *env, p pod) pod { e.kernel.MoveToHost("rxe1", p.path()); return p }, "host"},
		{"device vanished", func(e *env, p pod) pod { delete(e.kernel.where, "rxe1"); return p }, "<absent>"},
		{"record corrupt", func(e *env, p pod) pod {
			entries, _ := os.ReadDir(e.stateDir)
			for _, en := range entries {
				if strings.HasSuffix(en.Name(), ".json") {
					os.WriteFile(filepath.Join(e.stateDir, en.Name()), []byte("{garbage"), 0o600)
				}
			}
			return p
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			conf := e.netconf(p, "1.1.0", nil)
			if _, err := e.add(p, conf, ""); err != nil {
				t.Fatal(err)
			}
			p = tc.before(e, p)
			for i := 0; i < 2; i++ {
				if err := e.del(p, conf); err != nil {
					t.Fatalf("DEL %d: %v", i, err)
				}
			}
			if tc.want != "" {
				e.wantWhere("rxe1", tc.want)
			}
			if recs, err := state.New(e.stateDir); err == nil {
				if l, _ := recs.List(); len(l) != 0 {
					t.Fatalf("records left: %+v", l)
				}
			}
		})
	}
}

// emptyNS stands for CNI_NETNS="" on DEL.
type emptyNS struct{ ns.NetNS }

func (emptyNS) Path() string { return "" }

func TestDelWithoutStateOrConfig(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("never-added", "net1", "virtio", "virtio1")
	if err := e.del(p, e.netconf(p, "1.1.0", map[string]any{"prevResult": nil})); err != nil {
		t.Fatalf("DEL of an unknown attachment: %v", err)
	}
}

func TestDelKeepsStateWhenMoveBackFails(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	e.kernel.failMoveOut = errors.New("device or resource busy")
	wantErr(t, e.del(p, conf), "device or resource busy", "retry DEL")
	if len(e.records()) != 1 {
		t.Fatal("record dropped although the device is still in the pod")
	}
	e.kernel.failMoveOut = nil
	if err := e.del(p, conf); err != nil {
		t.Fatalf("retried DEL: %v", err)
	}
	e.wantWhere("rxe1", "host")
	if len(e.records()) != 0 {
		t.Fatal("record left after the retried DEL")
	}
}

func TestCheck(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	wantErr(t, e.check(p, conf), "no RDMA device is recorded")
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	if err := e.check(p, conf); err != nil {
		t.Fatalf("CHECK on a healthy pod: %v", err)
	}
	e.kernel.mode = "shared"
	wantErr(t, e.check(p, conf), "shared netns mode")
	e.kernel.mode = "exclusive"
	e.kernel.MoveToHost("rxe1", p.path())
	wantErr(t, e.check(p, conf), "rxe1", "no longer in the pod")
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", map[string]any{"prevResult": nil})
	status := func() error {
		a := &skel.CmdArgs{StdinData: conf}
		return e.plugin.Status(a)
	}
	if err := status(); err != nil {
		t.Fatalf("STATUS in exclusive mode: %v", err)
	}
	e.kernel.mode = "shared"
	err := status()
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrPluginNotAvailable || !strings.Contains(terr.Details, "exclusive") {
		t.Fatalf("STATUS in shared mode = %v, want error code 50 with the remedy", err)
	}
	e.kernel.mode = ""
	e.kernel.modeErr = errors.New("protocol not supported")
	if err := status(); !errors.As(err, &terr) || terr.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS without RDMA = %v, want error code 50", err)
	}
}

func TestGC(t *testing.T) {
	e := newEnv(t)
	keep := e.newPod("keep", "net1", "virtio", "virtio1")
	drop := e.newPod("drop", "net1", "virtio", "virtio2")
	gone := e.newPod("gone", "net1", "pci", "0000:3b:00.0")
	for _, p := range []pod{keep, drop, gone} {
		if _, err := e.add(p, e.netconf(p, "1.1.0", nil), ""); err != nil {
			t.Fatal(err)
		}
	}
	e.deleteNetns(gone)
	conf := e.netconf(keep, "1.1.0", map[string]any{
		"prevResult":                nil,
		"cni.dev/valid-attachments": []map[string]string{{"containerID": "keep", "ifname": "net1"}},
	})
	if err := e.plugin.GC(&skel.CmdArgs{StdinData: conf}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	e.wantWhere("rxe1", keep.path())
	e.wantWhere("rxe2", "host")
	e.wantWhere("mlx5_0", "host")
	if recs := e.records(); len(recs) != 1 || recs[0].ContainerID != "keep" {
		t.Fatalf("records after GC = %+v", recs)
	}
}

func TestRenameInPod(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", map[string]any{"rdmaDevName": "roce0"})
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("roce0", p.path())
	e.wantWhere("rxe1", "<absent>")
	if err := e.check(p, conf); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := e.del(p, conf); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", "host")
	e.wantWhere("roce0", "<absent>")
}

func TestRenameRestoredAfterNetnsDeletion(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", map[string]any{"rdmaDevName": "roce0"})
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	e.deleteNetns(p)
	e.wantWhere("roce0", "host")
	if err := e.del(p, conf); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", "host")
}

func TestRenameClashRefused(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	before := e.kernel.snapshot()
	_, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"rdmaDevName": "mlx5_0"}), "")
	wantErr(t, err, "mlx5_0", "already has a device of that name")
	if e.kernel.snapshot() != before || len(e.records()) != 0 {
		t.Fatal("something changed")
	}
}

func TestQoSAppliedCheckedAndCleared(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", map[string]any{"rdmaQoS": map[string]any{"tos": 106}, "rdmaDevName": "roce0"})
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	if got := e.kernel.qos["roce0"]; got.ToS == nil || *got.ToS != 106 {
		t.Fatalf("ToS not applied to the renamed device: %+v", e.kernel.qos)
	}
	if err := e.check(p, conf); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	delete(e.kernel.qos, "roce0") // e.g. the device was reset
	wantErr(t, e.check(p, conf), "rdmaQoS no longer holds", "roce0")
	if err := e.del(p, conf); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", "host")
}

func TestQoSFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	e.kernel.failQoS = errors.New("the rdma_cm module is not loaded")
	_, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"rdmaQoS": map[string]any{"tos": 106}, "rdmaDevName": "roce0"}), "")
	wantErr(t, err, "cannot apply rdmaQoS to RDMA device roce0", "rdma_cm")
	e.wantWhere("rxe1", "host")
	e.wantWhere("roce0", "<absent>")
	if len(e.records()) != 0 {
		t.Fatal("record left after rollback")
	}
}

// The log file is the node's: a network naming any other (the plugin runs
// as root and would append to it) fails ADD before anything moves, with a
// message naming the node's directory; a file in that directory is taken;
// DEL and CHECK of such a network never fail on the key.
func TestAddRefusesForeignLogFile(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	for _, f := range []string{"/etc/ld.so.preload", logging.Dir + "/../../../etc/cron.d/x", logging.Dir + "/sub/x.log", logging.Dir} {
		_, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"logFile": f}), "")
		wantErr(t, err, "sets logFile "+config.Quote(f), "only in the node's directory "+logging.Dir, "nothing was changed")
		e.wantWhere("rxe1", "host")
		if recs := e.records(); len(recs) != 0 {
			t.Fatalf("logFile %q: records %+v after the refusal", f, recs)
		}
	}
	conf := e.netconf(p, "1.1.0", map[string]any{"logFile": logging.Dir + "/rdma-net.log"})
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatalf("ADD with a log file in %s: %v", logging.Dir, err)
	}
	e.wantWhere("rxe1", p.path())
	if err := e.del(p, e.netconf(p, "1.1.0", map[string]any{"logFile": "/etc/ld.so.preload"})); err != nil {
		t.Fatalf("DEL of a network with a foreign logFile: %v", err)
	}
	e.wantWhere("rxe1", "host")
}

// A NAD's stateDir never chooses where the plugin, as root, writes: ADD
// refuses one that is not the node's directory (nothing moves, no record
// anywhere), accepts the node's own spelled out, and a DEL of a network
// that names another directory still undoes the attachment from the
// node's records.
func TestAddRefusesForeignStateDir(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	elsewhere := t.TempDir()
	for _, d := range []string{elsewhere, "/etc/cron.d", config.DefaultStateDir + "/../../etc"} {
		_, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"stateDir": d}), "")
		wantErr(t, err, "sets stateDir "+config.Quote(d), "only in the node's directory "+config.DefaultStateDir, "nothing was changed")
		e.wantWhere("rxe1", "host")
		if recs := e.records(); len(recs) != 0 {
			t.Fatalf("stateDir %q: records %+v after the refusal", d, recs)
		}
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("the network's stateDir %s got %d entries", elsewhere, len(entries))
	}
	if _, err := e.add(p, e.netconf(p, "1.1.0", map[string]any{"stateDir": config.DefaultStateDir + "/"}), ""); err != nil {
		t.Fatalf("ADD naming the node's own directory: %v", err)
	}
	e.wantWhere("rxe1", p.path())
	if recs := e.records(); len(recs) != 1 {
		t.Fatalf("records %+v, want the attachment's in the node's directory", recs)
	}
	if err := e.del(p, e.netconf(p, "1.1.0", map[string]any{"stateDir": elsewhere})); err != nil {
		t.Fatalf("DEL of a network with a foreign stateDir: %v", err)
	}
	e.wantWhere("rxe1", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records %+v left after DEL", recs)
	}
}
