package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

const (
	draPod   = "7f3c9a62-0b1d-4a8e-9c55-2f6d1e0a4b01"
	otherPod = "0c4e2d8f-5a7b-4e19-8d3c-6b1f9e2a7c02"
)

// delegated is one call rdma-netns made of another plugin.
type delegated struct {
	verb, plugin string
	conf         map[string]any
	// rxe2 is where the fake kernel had RDMA device rxe2 at the call,
	// links the pod's netdevs (fakeKernel.links).
	rxe2, links string
}

// fakeDelegate stands in for host-device (and an IPAM plugin): it records
// each call and answers ADD with the result host-device gives.
type fakeDelegate struct {
	mu     sync.Mutex
	k      *fakeKernel
	p      pod
	calls  []delegated
	addErr error
	delErr error
}

func (d *fakeDelegate) record(verb, plugin string, conf []byte) map[string]any {
	var m map[string]any
	if err := json.Unmarshal(conf, &m); err != nil {
		panic(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, delegated{verb, plugin, m, d.k.location("rxe2"), d.k.links(d.p.path())})
	return m
}

func (d *fakeDelegate) Add(_ context.Context, plugin string, conf []byte) (types.Result, error) {
	m := d.record("ADD", plugin, conf)
	if d.addErr != nil {
		return nil, d.addErr
	}
	// host-device moves the NIC, where the fake kernel has one there.
	if pci, _ := m["pciBusID"].(string); plugin == hostDevice && pci != "" {
		if _, err := d.k.hostDeviceAdd(pci, d.p.path(), d.p.ifName); err != nil {
			return nil, err
		}
	}
	return &current.Result{CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: d.p.ifName, Sandbox: d.p.path(), Mac: "02:00:00:00:00:05"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: mustCIDR("10.1.2.3/24")}},
	}, nil
}

func (d *fakeDelegate) Del(_ context.Context, plugin string, conf []byte) error {
	m := d.record("DEL", plugin, conf)
	if d.delErr != nil || plugin != hostDevice {
		return d.delErr
	}
	dev, _ := m["device"].(string)
	return d.k.hostDeviceDel(d.p.path(), dev)
}

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

// draEnv is a node where the DRA driver prepared rxe1's NIC (0000:00:04.0,
// eth1) and rxe2's (0000:00:05.0, eth2) for draPod's claim "nics", and
// mlx5_0's NIC (ens1f0) for another pod's request "secret".
func draEnv(t *testing.T) (*env, pod, *fakeDelegate, string) {
	e := newEnv(t)
	for _, l := range []fakeNetdev{
		{name: "eth1", bus: "virtio", parent: "virtio1", pci: "0000:00:04.0"},
		{name: "eth2", bus: "virtio", parent: "virtio2", pci: "0000:00:05.0"},
		{name: "ens1f0", bus: "pci", parent: "0000:3b:00.0", pci: "0000:3b:00.0"},
	} {
		e.kernel.addNetdev(l)
	}
	p := e.newPod("c1", "net1", "", "")
	d := &fakeDelegate{k: e.kernel, p: p}
	e.plugin.Delegate = d
	dir := filepath.Join(t.TempDir(), "dra")
	e.plugin.DRARecordDir = dir
	rec := drarecord.Dir(dir)
	for _, c := range []*drarecord.Claim{
		{Version: 1, ClaimUID: "claim-1", ClaimName: "p-nics-x", PodClaimName: "nics", PodUID: draPod, Devices: []drarecord.Device{
			{Request: "nics", PCIAddress: "0000:00:04.0", Device: "pci-0000-00-04-0", Pool: "node1", Netdev: "eth1"},
			{Request: "nics", PCIAddress: "0000:00:05.0", Device: "pci-0000-00-05-0", Pool: "node1", Netdev: "eth2"},
		}},
		{Version: 1, ClaimUID: "claim-2", ClaimName: "q-x", PodClaimName: "x", PodUID: otherPod, Devices: []drarecord.Device{
			{Request: "secret", PCIAddress: "0000:3b:00.0", Device: "pci-0000-3b-00-0", Pool: "node1", Netdev: "ens1f0"},
		}},
	} {
		if err := rec.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	return e, p, d, dir
}

func (e *env) draConf(p pod, dra map[string]any, extra map[string]any) []byte {
	all := map[string]any{"prevResult": nil, "dra": dra, "ipam": map[string]any{"type": "static", "addresses": []any{map[string]any{"address": "10.1.2.3/24"}}}}
	for k, v := range extra {
		all[k] = v
	}
	return e.netconf(p, "1.1.0", all)
}

func podArgs(uid string) string {
	return "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=" + uid
}

func argsCNI(kv map[string]any) map[string]any {
	return map[string]any{"args": map[string]any{"cni": kv}}
}

func wantConf(t *testing.T, got map[string]any, want string) {
	t.Helper()
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	g, _ := json.Marshal(got)
	wb, _ := json.Marshal(w)
	if string(g) != string(wb) {
		t.Fatalf("delegated config\n %s\nwant\n %s", g, wb)
	}
}

const staticIPAM = `"ipam":{"type":"static","addresses":[{"address":"10.1.2.3/24"}]}`

// ADD hands host-device the PCI address of the pod's claimed NIC, with
// the network's ipam and nothing of the runtime's, then moves that NIC's
// RDMA device; CHECK holds on the result; DEL returns the RDMA device
// before host-device takes the NIC out by its name in the pod.
func TestDRAAddDel(t *testing.T) {
	e, p, d, _ := draEnv(t)
	conf := e.draConf(p, map[string]any{"request": "nics", "index": 1},
		map[string]any{"runtimeConfig": map[string]any{"deviceID": "0000:00:05.0"}})
	res, err := e.add(p, conf, podArgs(draPod))
	if err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	if len(d.calls) != 1 || d.calls[0].verb != "ADD" || d.calls[0].plugin != "host-device" {
		t.Fatalf("delegated %+v, want one host-device ADD", d.calls)
	}
	wantConf(t, d.calls[0].conf, `{"cniVersion":"1.1.0","name":"rdma-net","type":"host-device","pciBusID":"0000:00:05.0",`+staticIPAM+`}`)
	e.wantWhere("rxe2", p.path())
	e.wantWhere("rxe1", "host")
	e.wantWhere("mlx5_0", "host")
	got, err := current.NewResultFromResult(res)
	if err != nil || len(got.Interfaces) != 1 || got.Interfaces[0].Mac != "02:00:00:00:00:05" || len(got.IPs) != 1 {
		t.Fatalf("ADD result %+v (%v), want host-device's", got, err)
	}
	if recs := e.records(); len(recs) != 1 || recs[0].Device != "rxe2" || recs[0].PCIAddress != "0000:00:05.0" {
		t.Fatalf("records %+v", recs)
	}
	if !strings.Contains(e.log.String(), "by the pod's claim (request nics) 0000:00:05.0") {
		t.Errorf("log does not say the claim chose the device:\n%s", e.log)
	}

	var prev map[string]any
	b, _ := json.Marshal(got)
	_ = json.Unmarshal(b, &prev)
	if err := e.check(p, e.draConf(p, map[string]any{"request": "nics", "index": 1}, map[string]any{"prevResult": prev})); err != nil {
		t.Fatalf("CHECK on the ADD's result: %v", err)
	}

	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.wantWhere("rxe2", "host")
	if len(d.calls) != 2 || d.calls[1].verb != "DEL" || d.calls[1].plugin != "host-device" {
		t.Fatalf("delegated %+v, want host-device ADD then DEL", d.calls)
	}
	if d.calls[1].rxe2 != "host" {
		t.Fatalf("host-device DEL ran while RDMA device rxe2 was in %s: the RDMA device must go home first", d.calls[1].rxe2)
	}
	wantConf(t, d.calls[1].conf, `{"cniVersion":"1.1.0","name":"rdma-net","type":"host-device","device":"net1",`+staticIPAM+`}`)
}

// Which of the pod's NICs: the network's request and index, the pod's
// draRequest and draIndex only where the network leaves them unset.
func TestDRAPick(t *testing.T) {
	for _, tt := range []struct {
		name    string
		dra     map[string]any
		podArgs map[string]any
		want    string   // PCI address handed to host-device
		errs    []string // else: the error says these
	}{
		{name: "network's request, first NIC", dra: map[string]any{"request": "nics"}, want: "0000:00:04.0"},
		{name: "all the pod's NICs, network's index", dra: map[string]any{"index": 1}, want: "0000:00:05.0"},
		{name: "pod's index where the network sets none", dra: map[string]any{"request": "nics"}, podArgs: map[string]any{"draIndex": 1}, want: "0000:00:05.0"},
		{name: "pod's request where the network sets none", dra: map[string]any{"index": 1}, podArgs: map[string]any{"draRequest": "nics"}, want: "0000:00:05.0"},
		{name: "pod repeats the network's index", dra: map[string]any{"index": 0}, podArgs: map[string]any{"draIndex": 0}, want: "0000:00:04.0"},
		{name: "pod may not override the network's index", dra: map[string]any{"index": 0}, podArgs: map[string]any{"draIndex": 1},
			errs: []string{"args.cni.draIndex 1", "dra.index", "never widen"}},
		{name: "pod may not override the network's request", dra: map[string]any{"request": "nics"}, podArgs: map[string]any{"draRequest": "gpus"},
			errs: []string{`args.cni.draRequest "gpus"`, "dra.request", "never widen"}},
		{name: "draIndex must be a number", dra: map[string]any{}, podArgs: map[string]any{"draIndex": "1"}, errs: []string{"args.cni.draIndex", "whole number"}},
		{name: "draIndex bounded", dra: map[string]any{}, podArgs: map[string]any{"draIndex": 1e9}, errs: []string{"args.cni.draIndex", "whole number"}},
		{name: "draRequest a request name", dra: map[string]any{}, podArgs: map[string]any{"draRequest": "../x"}, errs: []string{`args.cni.draRequest "../x"`, "not a request name"}},
		{name: "another pod's request", dra: map[string]any{}, podArgs: map[string]any{"draRequest": "secret"},
			errs: []string{`for request "secret"`, `its requests: "nics" (2)`}},
		{name: "index past the pod's NICs", dra: map[string]any{"request": "nics", "index": 2},
			errs: []string{"holds 2 NIC(s)", "no NIC at index 2", `"nics" (2)`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, p, d, _ := draEnv(t)
			var extra map[string]any
			if tt.podArgs != nil {
				extra = argsCNI(tt.podArgs)
			}
			_, err := e.add(p, e.draConf(p, tt.dra, extra), podArgs(draPod))
			if tt.errs != nil {
				wantErr(t, err, tt.errs...)
				if strings.Contains(err.Error(), "0000:3b") || strings.Contains(err.Error(), "secret\" (") {
					t.Fatalf("the refusal names another pod's NIC or request: %v", err)
				}
				if len(d.calls) != 0 {
					t.Fatalf("delegated %+v after a refusal", d.calls)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if len(d.calls) != 1 || d.calls[0].conf["pciBusID"] != tt.want {
				t.Fatalf("delegated %+v, want pciBusID %s", d.calls, tt.want)
			}
		})
	}
}

// Without a record of the pod, without a usable K8S_POD_UID or with a
// prevResult, ADD fails before host-device runs; a bad UID is refused
// before the record directory is read.
func TestDRARefusals(t *testing.T) {
	e, p, d, _ := draEnv(t)
	dra := map[string]any{}
	_, err := e.add(p, e.draConf(p, dra, nil), podArgs("e5a1c0de-0000-4000-8000-000000000000"))
	wantErr(t, err, "pod ns/p has no NIC prepared by driver nic.rdma-netns.io on this node", "DeviceClass rdma-nic.rdma-netns.io")
	if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "0000:") {
		t.Fatalf("error names another pod's claim: %v", err)
	}
	_, err = e.add(p, e.draConf(p, dra, nil), "K8S_POD_NAME=p")
	wantErr(t, err, "dra mode needs K8S_POD_UID, which Multus passes")
	_, err = e.add(p, e.netconf(p, "1.1.0", map[string]any{"dra": dra}), podArgs(draPod))
	wantErr(t, err, "must come first in the plugin chain", "prevResult")
	_, err = e.add(p, e.draConf(p, dra, map[string]any{"pciBusID": "0000:3b:00.0"}), podArgs(draPod))
	wantErr(t, err, "also sets pciBusID")

	// A record's PCI address becomes a path in host-device: only a PCI
	// address is passed on.
	bad := filepath.Join(t.TempDir(), "bad")
	if err := drarecord.Dir(bad).Write(&drarecord.Claim{Version: 1, ClaimUID: "c9", PodUID: draPod,
		Devices: []drarecord.Device{{Request: "nics", PCIAddress: "../../../tmp/x"}}}); err != nil {
		t.Fatal(err)
	}
	e.plugin.DRARecordDir = bad
	_, err = e.add(p, e.draConf(p, dra, nil), podArgs(draPod))
	wantErr(t, err, `the PCI address "../../../tmp/x", which is not one`)

	// A record directory that cannot be read fails ADD: a UID it reached
	// would get that error, not the UID's refusal.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.plugin.DRARecordDir = notDir
	_, err = e.add(p, e.draConf(p, dra, nil), podArgs(draPod))
	wantErr(t, err, "cannot read the DRA driver's records")
	for _, uid := range []string{"../" + draPod, "x/y", "..", strings.Repeat("a", 65)} {
		_, err = e.add(p, e.draConf(p, dra, nil), podArgs(uid))
		wantErr(t, err, "K8S_POD_UID", "pod UID")
		if strings.Contains(err.Error(), "records") {
			t.Fatalf("UID %q reached the record directory: %v", uid, err)
		}
	}
	if len(d.calls) != 0 {
		t.Fatalf("delegated %+v after refusals", d.calls)
	}
	e.wantWhere("rxe1", "host")
	e.wantWhere("rxe2", "host")
}

// When the RDMA move fails after host-device moved the NIC, host-device
// takes the NIC back and ADD reports the move's failure.
func TestDRARollback(t *testing.T) {
	e, p, d, _ := draEnv(t)
	e.kernel.failMoveIn = errors.New("injected move failure")
	_, err := e.add(p, e.draConf(p, map[string]any{}, nil), podArgs(draPod))
	wantErr(t, err, "injected move failure")
	if len(d.calls) != 2 || d.calls[0].verb != "ADD" || d.calls[1].verb != "DEL" || d.calls[1].plugin != "host-device" || d.calls[1].conf["device"] != "net1" {
		t.Fatalf("delegated %+v, want host-device ADD then DEL of net1", d.calls)
	}
	e.wantWhere("rxe1", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}

	d.calls = nil
	d.delErr = errors.New("injected DEL failure")
	_, err = e.add(p, e.draConf(p, map[string]any{}, nil), podArgs(draPod))
	wantErr(t, err, "injected move failure", "could not take NIC 0000:00:04.0 back", "injected DEL failure")
}

// DEL needs no record: with the pod's netns gone the NIC is back in the
// host and only the addresses are released; a link host-device no longer
// finds in the pod was taken out already. Another failure fails DEL.
func TestDRADelAlreadyDone(t *testing.T) {
	e, p, d, _ := draEnv(t)
	conf := e.draConf(p, map[string]any{}, nil)
	d.delErr = &types.Error{Code: 999, Msg: `failed to find "net1" in containerNS: Link not found`}
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL with the link gone: %v", err)
	}
	if len(d.calls) != 1 || d.calls[0].plugin != "host-device" {
		t.Fatalf("delegated %+v", d.calls)
	}

	d.calls = nil
	d.delErr = errors.New("failed to move \"net1\" to tempNS: device busy")
	wantErr(t, e.del(p, conf), "host-device could not take NIC net1 out of the pod", "device busy", "retry DEL")

	d.calls = nil
	d.delErr = nil
	e.deleteNetns(p)
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL with the netns gone: %v", err)
	}
	if len(d.calls) != 1 || d.calls[0].plugin != "static" || d.calls[0].conf["device"] != "net1" {
		t.Fatalf("delegated %+v, want the IPAM plugin's DEL alone", d.calls)
	}
	d.calls = nil
	if err := e.del(p, e.draConf(p, map[string]any{}, map[string]any{"ipam": nil})); err != nil || len(d.calls) != 0 {
		t.Fatalf("DEL with the netns gone and no ipam: %v, delegated %+v", err, d.calls)
	}
}

// The pod's addresses (Multus's runtimeConfig.ips, for a network that
// declares the "ips" capability) reach host-device's static IPAM on ADD;
// without the capability they are not passed, and never to DEL, which
// must not fail on what the pod wrote.
func TestDRAPassesPodIPs(t *testing.T) {
	for _, declared := range []bool{true, false} {
		e, p, d, _ := draEnv(t)
		extra := map[string]any{"runtimeConfig": map[string]any{"ips": []any{"10.9.8.7/24"}}}
		if declared {
			extra["capabilities"] = map[string]any{"ips": true}
		}
		conf := e.draConf(p, map[string]any{"request": "nics", "index": 1}, extra)
		if _, err := e.add(p, conf, podArgs(draPod)); err != nil {
			t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
		}
		if err := e.del(p, conf); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		rc := `,"capabilities":{"ips":true},"runtimeConfig":{"ips":["10.9.8.7/24"]}`
		if !declared {
			rc = ""
		}
		wantConf(t, d.calls[0].conf, `{"cniVersion":"1.1.0","name":"rdma-net","type":"host-device","pciBusID":"0000:00:05.0",`+staticIPAM+rc+`}`)
		wantConf(t, d.calls[1].conf, `{"cniVersion":"1.1.0","name":"rdma-net","type":"host-device","device":"net1",`+staticIPAM+`}`)
	}
}

// A pod's ips of any shape (here not even a list) never reach DEL: the
// attachment comes apart whatever the pod wrote.
func TestDRADelIgnoresPodIPs(t *testing.T) {
	e, p, d, _ := draEnv(t)
	conf := e.draConf(p, map[string]any{"request": "nics", "index": 1},
		map[string]any{"capabilities": map[string]any{"ips": true}, "runtimeConfig": map[string]any{"ips": map[string]any{"x": strings.Repeat("<", 1000)}}})
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	for _, c := range d.calls {
		if _, ok := c.conf["runtimeConfig"]; ok {
			t.Errorf("%s %s was given the pod's runtimeConfig: %v", c.plugin, c.verb, c.conf["runtimeConfig"])
		}
	}
}

// A dra network renames the claimed NIC's RDMA device in the pod and sets
// its RoCE type of service as any network does (the normal ADD runs on
// the NIC host-device took): rdma_r0 in the pod, ToS 106; DEL gives it
// back under its host name with the ToS cleared.
func TestDRARenameAndToS(t *testing.T) {
	e, p, _, _ := draEnv(t)
	conf := e.draConf(p, map[string]any{"request": "nics", "index": 1},
		map[string]any{"rdmaDevName": "rdma_r0", "rdmaQoS": map[string]any{"tos": 106}})
	if _, err := e.add(p, conf, podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rdma_r0", p.path())
	if s, ok := e.kernel.qos["rdma_r0"]; !ok || s.ToS == nil || *s.ToS != 106 {
		t.Fatalf("RoCE ToS of rdma_r0: %+v (set %v), want 106", s, ok)
	}
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.wantWhere("rxe2", "host")
	for _, dev := range []string{"rxe2", "rdma_r0"} {
		if _, ok := e.kernel.qos[dev]; ok {
			t.Errorf("%s's ToS left set after DEL", dev)
		}
	}
}

// The record directory is the node's: a NAD that points dra.recordDir at
// a directory it can write (a pod's emptyDir on the node) holding a
// forged record for its pod, naming the PCI address of a NIC its pod was
// never given (here mlx5_0's, another pod's claim), fails ADD: host-device
// never runs and no RDMA device moves. A NAD that names the node's own
// directory, as NADs did before, still works; DEL and CHECK never fail on
// the key.
func TestDRANADRecordDirRefused(t *testing.T) {
	e, p, d, _ := draEnv(t)
	forged := filepath.Join(t.TempDir(), "emptydir")
	if err := drarecord.Dir(forged).Write(&drarecord.Claim{Version: 1, ClaimUID: "forged", PodUID: draPod,
		Devices: []drarecord.Device{{Request: "nics", PCIAddress: "0000:3b:00.0"}}}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{forged, forged + "/", drarecord.DefaultDir + "/../x", "relative"} {
		_, err := e.add(p, e.draConf(p, map[string]any{"recordDir": dir}, nil), podArgs(draPod))
		if len(d.calls) != 0 {
			t.Fatalf("recordDir %q: host-device was run with %v (ADD: %v); mlx5_0 is in %s", dir, d.calls[0].conf, err, e.kernel.location("mlx5_0"))
		}
		wantErr(t, err, `network "rdma-net" sets dra.recordDir `+config.Quote(dir), "the node's setting", "--record-dir",
			drarecord.DefaultDir, `remove "recordDir"`, "nothing was changed")
	}
	for _, dev := range []string{"mlx5_0", "rxe1", "rxe2"} {
		e.wantWhere(dev, "host")
	}
	if recs := e.records(); len(recs) != 0 || e.kernel.moves != 0 {
		t.Fatalf("records %+v, %d moves after refusals", recs, e.kernel.moves)
	}

	// A NAD naming the node's directory: the pod gets its own claim's NIC,
	// from the node's records.
	for _, dir := range []string{drarecord.DefaultDir, "/var/lib/cni//rdma-netns-dra/"} {
		d.calls = nil
		conf := e.draConf(p, map[string]any{"request": "nics", "index": 1, "recordDir": dir}, nil)
		_, err := e.add(p, conf, podArgs(draPod))
		if err != nil || len(d.calls) != 1 || d.calls[0].conf["pciBusID"] != "0000:00:05.0" {
			t.Fatalf("recordDir %q: ADD %v, delegated %+v; want the claim's 0000:00:05.0\nlog:\n%s", dir, err, d.calls, e.log)
		}
		e.wantWhere("rxe2", p.path())
		if err := e.del(p, conf); err != nil {
			t.Fatalf("recordDir %q: DEL: %v", dir, err)
		}
		e.wantWhere("rxe2", "host")
	}

	// DEL and CHECK of a network ADD now refuses: an attachment made
	// before the key was refused comes apart, and CHECK says what ADD
	// would refuse without failing on it.
	conf := e.draConf(p, map[string]any{"request": "nics", "index": 1}, nil)
	res, err := e.add(p, conf, podArgs(draPod))
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	forgedConf := func(extra map[string]any) []byte {
		return e.draConf(p, map[string]any{"request": "nics", "index": 1, "recordDir": "relative"}, extra)
	}
	got, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	var prev map[string]any
	b, _ := json.Marshal(got)
	_ = json.Unmarshal(b, &prev)
	e.log.Reset()
	if err := e.check(p, forgedConf(map[string]any{"prevResult": prev})); err != nil {
		t.Fatalf("CHECK with a recordDir: %v", err)
	}
	if !strings.Contains(e.log.String(), `sets dra.recordDir "relative"`) {
		t.Errorf("CHECK does not say the network's recordDir is refused:\n%s", e.log)
	}
	if err := e.del(p, forgedConf(nil)); err != nil {
		t.Fatalf("DEL with a recordDir: %v", err)
	}
	e.wantWhere("rxe2", "host")
	if last := d.calls[len(d.calls)-1]; last.verb != "DEL" || last.plugin != "host-device" {
		t.Fatalf("DEL delegated %+v, want host-device's DEL", d.calls)
	}
}

// withCDI rewrites claim-1's record as a driver with CDI on writes it.
func withCDI(t *testing.T, dir, cdiDir string) {
	t.Helper()
	recs := drarecord.Dir(dir)
	c, ok, err := recs.Load("claim-1")
	if err != nil || !ok {
		t.Fatalf("claim-1's record: %v, %v", ok, err)
	}
	c.CDIDir = cdiDir
	if err := recs.Write(c); err != nil {
		t.Fatal(err)
	}
}

// A claim prepared with CDI: each ADD that attaches one of its NICs
// writes that NIC's CDI spec with the verbs node the kernel gave its RDMA
// device in the pod (the move makes it anew: the fake kernel gives each
// move a new one, so a node read before the move would be wrong), and
// rdma_cm.
func TestDRAWritesCDISpec(t *testing.T) {
	e, p, d, dir := draEnv(t)
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	withCDI(t, dir, cdiDir)
	for _, i := range []int{1, 0} {
		conf := e.draConf(p, map[string]any{"request": "nics", "index": i}, nil)
		q := p
		q.ifName = fmt.Sprintf("rail%d", i)
		d.p = q // the fake host-device's name for the NIC in the pod
		if _, err := e.add(q, conf, podArgs(draPod)); err != nil {
			t.Fatalf("ADD %s: %v\nlog:\n%s", q.ifName, err, e.log)
		}
	}
	for dev, rdma := range map[string]string{"pci-0000-00-05-0": "rxe2", "pci-0000-00-04-0": "rxe1"} {
		b, err := os.ReadFile(filepath.Join(cdiDir, "nic.rdma-netns.io_nic_claim-1_"+dev+".json"))
		if err != nil {
			t.Fatalf("%s: %v", dev, err)
		}
		n := e.kernel.uverbs[rdma]
		want := fmt.Sprintf(`{"cdiVersion":"0.5.0","kind":"nic.rdma-netns.io/nic","devices":[{"name":"claim-1-%s","containerEdits":{"deviceNodes":[{"path":"/dev/infiniband/uverbs%d","type":"c","major":231,"minor":%d,"fileMode":438,"permissions":"rw"}]}}],"containerEdits":{"deviceNodes":[{"path":"/dev/infiniband/rdma_cm","type":"c","major":10,"minor":58,"fileMode":438,"permissions":"rw"}]}}`,
			dev, n, 192+n)
		if string(b) != want {
			t.Errorf("%s's spec\n%s\nwant\n%s", dev, b, want)
		}
	}

	// An ADD stopped after the move left no spec: the runtime's ADD again
	// finds the device in the pod and writes it.
	spec := filepath.Join(cdiDir, "nic.rdma-netns.io_nic_claim-1_pci-0000-00-05-0.json")
	first, _ := os.ReadFile(spec)
	if err := os.Remove(spec); err != nil {
		t.Fatal(err)
	}
	q := p
	q.ifName = "rail1"
	d.p = q
	if _, err := e.add(q, e.draConf(p, map[string]any{"request": "nics", "index": 1}, nil), podArgs(draPod)); err != nil {
		t.Fatalf("ADD again: %v\nlog:\n%s", err, e.log)
	}
	if again, err := os.ReadFile(spec); err != nil || string(again) != string(first) {
		t.Errorf("the spec after ADD again: %s (%v), want %s", again, err, first)
	}
}

// A spec that cannot be written fails the ADD and rolls it back: the
// RDMA device and the NIC go home and no record is left, so the sandbox
// fails rather than a container starting without its verbs node.
func TestDRACDIWriteFailsRollsBack(t *testing.T) {
	e, p, d, dir := draEnv(t)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	withCDI(t, dir, notDir)
	conf := e.draConf(p, map[string]any{"request": "nics", "index": 1}, nil)
	_, err := e.add(p, conf, podArgs(draPod))
	if err == nil || !strings.Contains(err.Error(), "CDI spec of device pci-0000-00-05-0") {
		t.Fatalf("ADD: %v, want the CDI spec's failure", err)
	}
	e.wantWhere("rxe2", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("records %+v left", recs)
	}
	if last := d.calls[len(d.calls)-1]; last.verb != "DEL" || last.plugin != "host-device" {
		t.Errorf("last delegated call %+v, want host-device's DEL taking the NIC back", last)
	}
}
