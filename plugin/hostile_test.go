package plugin

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// A pod names its interface in its network-selection element ("interface"),
// and libcni, skel and the kernel accept bytes that ADD refuses: control
// characters, and what a shell reads (';', quotes, a backquote) when the
// doctor prints the name to an operator. DEL runs before host-device's in
// the chain and libcni stops at the first failure: a DEL that failed on
// the name would keep host-device from returning the NIC, and the kernel
// would bring it home under the pod's name. So ADD refuses the name and
// changes nothing, and DEL, CHECK and GC succeed on it.
func TestDelSurvivesPodChosenIfName(t *testing.T) {
	for _, name := range []string{"net\x01", "net\x7f", "net\u0090", "a;b", "x'y", "a`id`", "b';>X;'", "-x"} {
		t.Run(strings.Trim(jsonString(t, name), `"`), func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", name, "virtio", "virtio1")
			conf := e.netconf(p, "1.1.0", nil)
			before := e.kernel.snapshot()
			_, err := e.add(p, conf, "")
			wantErr(t, err, "invalid interface name", "nothing was changed", "letters, digits")
			if after := e.kernel.snapshot(); after != before {
				t.Fatalf("devices changed: %s -> %s", before, after)
			}
			if recs := e.records(); len(recs) != 0 {
				t.Fatalf("the refused ADD wrote records: %+v", recs)
			}
			a := e.args(p, conf, "")
			for i := 0; i < 2; i++ {
				if err := e.plugin.Del(a); err != nil {
					t.Fatalf("DEL %d: %v", i, err)
				}
			}
			if err := e.plugin.Check(a); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			if err := e.plugin.GC(a); err != nil {
				t.Errorf("GC: %v", err)
			}
			e.deleteNetns(p)
			if err := e.plugin.Del(a); err != nil {
				t.Fatalf("DEL without netns: %v", err)
			}
			e.wantWhere("rxe1", "host")
			if strings.ContainsAny(e.log.String(), "\x01\x7f\u0090") {
				t.Errorf("the log carries the raw interface name:\n%q", e.log.String())
			}
		})
	}
}

// A pod that an older ADD attached under a name ADD now refuses keeps its
// device until its DEL, which returns it and removes the record: the
// record loads, and CHECK checks it.
func TestDelOfAttachmentUnderRefusedIfName(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "a;b", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	st, err := state.New(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	// What the older ADD left: the device in the pod, its record.
	if _, err := e.kernel.MoveToNetns("rxe1", p.path(), 0); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(&state.Record{Key: state.Key{Network: "rdma-net", ContainerID: "c1", IfName: "a;b"},
		Netns: p.path(), Device: "rxe1", State: state.StateAttached}); err != nil {
		t.Fatal(err)
	}
	if err := e.check(p, conf); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	e.kernel.MoveToHost("rxe1", p.path())
	if err := e.check(p, conf); err == nil {
		t.Errorf("CHECK passed with the recorded device gone from the pod")
	}
	if _, err := e.kernel.MoveToNetns("rxe1", p.path(), 0); err != nil {
		t.Fatal(err)
	}
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.wantWhere("rxe1", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("DEL left records: %+v", recs)
	}
}

// multusArgs is the network configuration Multus hands a plugin for a pod
// whose cni-args hold n times s: Multus decodes the annotation and encodes
// args.cni again with encoding/json, which writes '<', '>' and '&' as six
// bytes each (\u003c).
func (e *env) multusArgs(p pod, s string, n int) []byte {
	e.t.Helper()
	var conf map[string]any
	if err := json.Unmarshal(e.netconf(p, "1.1.0", nil), &conf); err != nil {
		e.t.Fatal(err)
	}
	conf["args"] = map[string]any{"cni": map[string]any{"note": strings.Repeat(s, n)}}
	data, err := json.Marshal(conf)
	if err != nil {
		e.t.Fatal(err)
	}
	return data
}

// A pod annotation may hold 256 KiB, which Multus's re-encoding makes up to
// six times larger on the plugin's stdin. The pod's cni-args are not
// rdma-netns's to judge by size: its own keys are read, and the rest is
// other plugins'. 200,000 '<' are 1.2 MB of stdin, over the 1 MiB the
// plugin used to refuse on every verb, DEL included.
func TestOversizedCNIArgs(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	big := e.multusArgs(p, "<", 200000)
	if len(big) <= 1<<20 {
		t.Fatalf("test bug: %d bytes", len(big))
	}
	if _, err := e.add(p, big, ""); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	e.wantWhere("rxe1", p.path())
	if err := e.check(p, big); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := e.del(p, big); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.wantWhere("rxe1", "host")

	// What the API server lets a pod write, at the worst re-encoding, is
	// under the plugin's bound for ADD; DEL takes any size.
	worst := e.multusArgs(p, "<", 256<<10)
	if len(worst) > config.MaxConfigSize {
		t.Fatalf("256 KiB of '<' re-encoded are %d bytes, over ADD's bound of %d", len(worst), config.MaxConfigSize)
	}
	huge := e.multusArgs(p, "<", config.MaxConfigSize/6+1)
	_, err := e.add(p, huge, "")
	wantErr(t, err, "network configuration is", "the pod's cni-args", "nothing was changed")
	if err := e.del(p, huge); err != nil {
		t.Fatalf("DEL of the refused ADD: %v", err)
	}
	e.wantWhere("rxe1", "host")
}

// A pod's deviceID on a network with allowedPodDevices is refused with the
// same words whatever it names: a free device, one another pod holds, a
// function with no RDMA device, nothing at all. The refusal names only what
// the pod may pick; the node's log keeps what the deviceID led to.
func TestDeviceIDProbeLearnsNothing(t *testing.T) {
	e := newEnv(t)
	holder := e.newPod("holder", "net1", "pci", "0000:3b:00.0")
	if _, err := e.add(holder, e.netconf(holder, "1.1.0", map[string]any{"name": "other-net", "deviceID": "0000:3b:00.0"}), "K8S_POD_NAMESPACE=t2;K8S_POD_NAME=holder"); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("mlx5_0", holder.path())
	probes := map[string]string{
		"held":        "0000:3b:00.0",
		"free":        "0000:47:00.0",
		"no function": "0000:99:00.0",
		"bad address": "0000:99",
	}
	texts := map[string]string{}
	for what, id := range probes {
		p := e.newPod("probe-"+strings.ReplaceAll(what, " ", "-"), "net1", "virtio", "virtio1")
		conf := e.netconf(p, "1.1.0", map[string]any{"allowedPodDevices": []string{"rxe1", "rxe2"}, "runtimeConfig": map[string]any{"deviceID": id}})
		before := e.kernel.snapshot()
		_, err := e.add(p, conf, "K8S_POD_NAMESPACE=t1;K8S_POD_NAME=probe")
		wantErr(t, err, `runtimeConfig.deviceID "`+id+`" refused`, "allowedPodDevices are rxe1, rxe2", "nothing was changed")
		if after := e.kernel.snapshot(); after != before {
			t.Fatalf("%s: devices changed: %s -> %s", what, before, after)
		}
		for _, leak := range []string{"mlx5", "rocep71s0f0", "held", "t2", "holder", "/sys", "/devices", "exist"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%s: the refusal says %q: %v", what, leak, err)
			}
		}
		texts[what] = strings.Replace(err.Error(), id, "ID", 1)
	}
	for what, text := range texts {
		if text != texts["held"] {
			t.Errorf("the refusal for a %s device differs from the one for a held device:\n%s\n%s", what, text, texts["held"])
		}
	}
}

// A network that lets its pods name their device (podRdmaDevNamePrefix)
// may not let them take the name another network gives its pods
// (rdmaDevName) once that network has used it on the node: names are
// node-wide, and the squatter would keep the other network's pods from
// starting there.
func TestPodNameMayNotSquatANetworksName(t *testing.T) {
	e := newEnv(t)
	named := func(p pod) []byte {
		return e.netconf(p, "1.1.0", map[string]any{"name": "job-net", "rdmaDevName": "rdma_net1"})
	}
	prefixed := func(p pod) []byte {
		return e.netconf(p, "1.1.0", map[string]any{"name": "free-net", "podRdmaDevNamePrefix": "rdma_"})
	}
	first := e.newPod("job-0", "net1", "virtio", "virtio2")
	if _, err := e.add(first, named(first), "K8S_POD_NAMESPACE=t2;K8S_POD_NAME=job-0"); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rdma_net1", first.path())
	if err := e.del(first, named(first)); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe2", "host")

	squat := e.newPod("squat", "net1", "virtio", "virtio1")
	_, err := e.add(squat, prefixed(squat), "K8S_POD_NAMESPACE=t1;K8S_POD_NAME=squat;rdmaDevName=rdma_net1")
	wantErr(t, err, `CNI_ARGS rdmaDevName "rdma_net1" refused`, "another network", "nothing was changed")
	if strings.Contains(err.Error(), "job-net") {
		t.Errorf("the refusal names the other network: %v", err)
	}
	e.wantWhere("rxe1", "host")

	// Any other name with the prefix is the pod's to take.
	if _, err := e.add(squat, prefixed(squat), "K8S_POD_NAMESPACE=t1;K8S_POD_NAME=squat;rdmaDevName=rdma_mine"); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rdma_mine", squat.path())
	next := e.newPod("job-1", "net1", "virtio", "virtio2")
	if _, err := e.add(next, named(next), "K8S_POD_NAMESPACE=t2;K8S_POD_NAME=job-1"); err != nil {
		t.Fatalf("the network's next pod: %v", err)
	}
	e.wantWhere("rdma_net1", next.path())
}

// host-device takes a pod's network-selection deviceID over its own
// device when its entry declares the deviceID capability, and rdma-netns
// follows the netdev host-device moved: a pod's deviceID that names "the
// netdev's own device" may be the pick that chose the netdev. So where
// rdma-netns sees a pod's deviceID (it declares the capability too), it
// holds it to allowedPodDevices whether or not it names the netdev's
// device; a network that pins the device itself still accepts a deviceID
// naming that device.
func TestHostDeviceCapabilityChain(t *testing.T) {
	// host-device moved eth2 (0000:00:05.0), which the pod's deviceID named.
	pick := map[string]any{"deviceID": "0000:00:05.0"}
	cases := []struct {
		name  string
		extra map[string]any
		want  string // the device that moves; "" for a refusal
	}{
		{"no allowedPodDevices", map[string]any{"runtimeConfig": pick}, ""},
		{"outside allowedPodDevices", map[string]any{"runtimeConfig": pick, "allowedPodDevices": []string{"rxe1"}}, ""},
		{"in allowedPodDevices", map[string]any{"runtimeConfig": pick, "allowedPodDevices": []string{"rxe2"}}, "rxe2"},
		{"network pins that device", map[string]any{"runtimeConfig": pick, "rdmaDevice": "rxe2"}, "rxe2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio2")
			conf := e.netconf(p, "1.1.0", tc.extra)
			_, err := e.add(p, conf, "")
			if tc.want == "" {
				wantErr(t, err, `runtimeConfig.deviceID "0000:00:05.0" refused`, "nothing was changed")
				e.wantWhere("rxe2", "host")
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			e.wantWhere(tc.want, p.path())
		})
	}
}

func jsonString(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Before a network's first pod on the node its name is not reserved there:
// a pod with a matching prefix may take it first (rdma-netns doctor nads
// names such prefixes). The network's pod then gets a clear refusal that
// names no pod of another namespace, the squatter's repeated ADD keeps its
// device, and once the squatter is gone the name is the network's.
func TestFirstComeSquat(t *testing.T) {
	e := newEnv(t)
	named := func(p pod) []byte {
		return e.netconf(p, "1.1.0", map[string]any{"name": "job-net", "rdmaDevName": "rdma_net1"})
	}
	squatConf := func(p pod) []byte {
		return e.netconf(p, "1.1.0", map[string]any{"name": "free-net", "podRdmaDevNamePrefix": "rdma_"})
	}
	const squatArgs = "K8S_POD_NAMESPACE=t1;K8S_POD_NAME=squat;rdmaDevName=rdma_net1"
	squat := e.newPod("squat", "net1", "virtio", "virtio1")
	if _, err := e.add(squat, squatConf(squat), squatArgs); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rdma_net1", squat.path())

	job := e.newPod("job-0", "net1", "virtio", "virtio2")
	_, err := e.add(job, named(job), "K8S_POD_NAMESPACE=t2;K8S_POD_NAME=job-0")
	wantErr(t, err, "cannot name the RDMA device rdma_net1 inside the pod", "a pod in another namespace already uses that name")
	if strings.Contains(err.Error(), "squat") {
		t.Errorf("the refusal names the other namespace's pod: %v", err)
	}
	e.wantWhere("rxe2", "host")
	// A refused ADD leaves the node as it was: it reserves nothing.
	st, err := state.New(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if by, err := st.NameReservedBy("rdma_net1"); by != "" || err != nil {
		t.Fatalf("the refused ADD reserved rdma_net1 for %q (%v)", by, err)
	}
	if _, err := e.add(squat, squatConf(squat), squatArgs); err != nil {
		t.Fatalf("the squatter's repeated ADD: %v", err)
	}
	e.wantWhere("rdma_net1", squat.path())

	if err := e.del(squat, squatConf(squat)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.add(job, named(job), "K8S_POD_NAMESPACE=t2;K8S_POD_NAME=job-0"); err != nil {
		t.Fatalf("the network's pod once the squatter is gone: %v", err)
	}
	e.wantWhere("rdma_net1", job.path())
	again := e.newPod("squat-2", "net1", "virtio", "virtio1")
	_, err = e.add(again, squatConf(again), "K8S_POD_NAMESPACE=t1;K8S_POD_NAME=squat-2;rdmaDevName=rdma_net1")
	wantErr(t, err, "another network on this node gives its pods that name")
}
