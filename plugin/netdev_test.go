package plugin

import (
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// hostNICs gives the node of newEnv the NICs of rxe1 (eth1) and rxe2
// (eth2) in the fake kernel, for host-device to move.
func (e *env) hostNICs() {
	e.kernel.addNetdev(fakeNetdev{name: "eth1", bus: "virtio", parent: "virtio1", pci: "0000:00:04.0"})
	e.kernel.addNetdev(fakeNetdev{name: "eth2", bus: "virtio", parent: "virtio2", pci: "0000:00:05.0"})
}

// chainAdd runs the chain host-device, rdma-netns for p's ADD: host-device
// moves the NIC of PCI function pci in as p.ifName.
func (e *env) chainAdd(p pod, pci string) []byte {
	e.t.Helper()
	if found, err := e.kernel.hostDeviceAdd(pci, p.path(), p.ifName); err != nil || !found {
		e.t.Fatalf("host-device ADD of %s: found %v, %v", pci, found, err)
	}
	conf := e.netconf(p, "1.1.0", nil)
	if _, err := e.add(p, conf, ""); err != nil {
		e.t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	return conf
}

// chainDel runs the chain's DEL: rdma-netns's, then host-device's.
func (e *env) chainDel(p pod, conf []byte) error {
	if err := e.del(p, conf); err != nil {
		return err
	}
	return e.kernel.hostDeviceDel(p.path(), p.ifName)
}

func (e *env) wantLinks(nsPath, want string) {
	e.t.Helper()
	if got := e.kernel.links(nsPath); got != want {
		e.t.Fatalf("links in %q: %s, want %s\nlog:\n%s", nsPath, got, want, e.log)
	}
}

// ADD records the NIC's host name, from the alias host-device just set,
// and the device behind it, as the kernel names it.
func TestAddRecordsHostNetdev(t *testing.T) {
	e := newEnv(t)
	e.hostNICs()
	p := e.newPod("c1", "net1", "", "")
	e.chainAdd(p, "0000:00:04.0")
	recs := e.records()
	if len(recs) != 1 || recs[0].HostNetdev != "eth1" || recs[0].NetdevParent != "virtio/virtio1" {
		t.Fatalf("records %+v, want host netdev eth1 behind virtio/virtio1", recs)
	}
}

// A tenant sets its NIC's alias to the host name of a neighbour's NIC
// (root in the pod may): host-device's DEL would bring the tenant's NIC
// home under the neighbour's name, and the neighbour's DEL would then
// fail on every retry, its NIC stranded. rdma-netns's DEL, which runs
// before host-device's in the chain, gives the link back its recorded
// host name, and the pod-set alias is logged escaped.
func TestDelRestoresNICAlias(t *testing.T) {
	e := newEnv(t)
	e.hostNICs()
	tenant := e.newPod("tenant", "net1", "", "")
	neighbour := e.newPod("neighbour", "net1", "", "")
	tconf := e.chainAdd(tenant, "0000:00:04.0")
	nconf := e.chainAdd(neighbour, "0000:00:05.0")
	e.kernel.setLink(tenant.path(), "net1", func(l *fakeNetdev) { l.alias = "eth2\x1b[2J" })

	if err := e.del(tenant, tconf); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantLinks(tenant.path(), "net1[eth1]@virtio/virtio1")
	if log := e.log.String(); strings.Contains(log, "\x1b") || !strings.Contains(log, `"eth2\x1b[2J"`) {
		t.Fatalf("log does not show the pod's alias escaped:\n%s", log)
	}
	if err := e.kernel.hostDeviceDel(tenant.path(), "net1"); err != nil {
		t.Fatalf("host-device DEL of the tenant: %v", err)
	}
	if err := e.chainDel(neighbour, nconf); err != nil {
		t.Fatalf("the neighbour's DEL: %v", err)
	}
	e.wantLinks("", "eth1[]@virtio/virtio1 eth2[]@virtio/virtio2")
	e.wantWhere("rxe1", "host")
	e.wantWhere("rxe2", "host")
}

// A pod that cleared its NIC's alias would fail host-device's DEL on
// every retry ("alias is not set"), its NIC kept in the pod: DEL gives the
// alias back.
func TestDelRestoresClearedAlias(t *testing.T) {
	e := newEnv(t)
	e.hostNICs()
	p := e.newPod("c1", "net1", "", "")
	conf := e.chainAdd(p, "0000:00:04.0")
	e.kernel.setLink(p.path(), "net1", func(l *fakeNetdev) { l.alias = "" })
	if err := e.chainDel(p, conf); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantLinks("", "eth1[]@virtio/virtio1 eth2[]@virtio/virtio2")
	if !strings.Contains(e.log.String(), `the pod had set the alias of its NIC net1 to ""`) {
		t.Fatalf("log does not say the pod cleared the alias:\n%s", e.log)
	}
}

// A pod that renamed its NIC (here to the neighbour's host name) and put a
// link of its own under CNI_IFNAME, with the neighbour's name as alias,
// gets its NIC found by the device behind it: the impostor is moved out of
// the way, the NIC renamed back to CNI_IFNAME with its alias restored, so
// host-device takes the NIC home under its own name.
func TestDelRenamesNICBack(t *testing.T) {
	e := newEnv(t)
	e.hostNICs()
	tenant := e.newPod("tenant", "net1", "", "")
	neighbour := e.newPod("neighbour", "net1", "", "")
	tconf := e.chainAdd(tenant, "0000:00:04.0")
	nconf := e.chainAdd(neighbour, "0000:00:05.0")
	e.kernel.setLink(tenant.path(), "net1", func(l *fakeNetdev) { l.name, l.alias = "eth2", "eth2" })
	e.kernel.addNetdev(fakeNetdev{netns: tenant.path(), name: "net1", alias: "eth2", up: true})

	if err := e.del(tenant, tconf); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantLinks(tenant.path(), "net1[eth1]@virtio/virtio1 rn-aside0[eth2]@")
	for _, want := range []string{`renamed it back from "eth2"`, "the pod's link net1 is not its NIC"} {
		if !strings.Contains(e.log.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, e.log)
		}
	}
	if err := e.kernel.hostDeviceDel(tenant.path(), "net1"); err != nil {
		t.Fatalf("host-device DEL of the tenant: %v", err)
	}
	if err := e.chainDel(neighbour, nconf); err != nil {
		t.Fatalf("the neighbour's DEL: %v", err)
	}
	e.wantLinks("", "eth1[]@virtio/virtio1 eth2[]@virtio/virtio2")
}

// In dra mode rdma-netns runs host-device's DEL itself: the NIC carries
// CNI_IFNAME and its host name again before that DEL, so host-device
// finds it (a renamed NIC used to count as already taken out) and brings
// it home under its own name; the neighbour's DEL then succeeds.
func TestDRADelRestoresNIC(t *testing.T) {
	e, p, d, _ := draEnv(t)
	neighbour := e.newPod("c2", "net1", "", "")
	d.p = neighbour
	nconf := e.draConf(neighbour, map[string]any{"request": "secret"}, nil)
	if _, err := e.add(neighbour, nconf, podArgs(otherPod)); err != nil {
		t.Fatalf("the neighbour's ADD: %v\nlog:\n%s", err, e.log)
	}
	d.p = p
	conf := e.draConf(p, map[string]any{"request": "nics", "index": 1}, nil)
	if _, err := e.add(p, conf, podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	if recs := e.records(); len(recs) != 2 {
		t.Fatalf("records %+v", recs)
	}
	e.kernel.setLink(p.path(), "net1", func(l *fakeNetdev) { l.name, l.alias = "x0", "ens1f0" })

	d.calls = nil
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	if len(d.calls) != 1 || d.calls[0].verb != "DEL" || d.calls[0].links != "net1[eth2]@virtio/virtio2" {
		t.Fatalf("delegated %+v, want host-device's DEL while the pod has net1 with alias eth2", d.calls)
	}
	e.wantLinks(p.path(), "")
	e.wantLinks("", "eth1[]@virtio/virtio1 eth2[]@virtio/virtio2")

	d.p = neighbour
	if err := e.del(neighbour, nconf); err != nil {
		t.Fatalf("the neighbour's DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantLinks("", "ens1f0[]@pci/0000:3b:00.0 eth1[]@virtio/virtio1 eth2[]@virtio/virtio2")
	e.wantWhere("mlx5_0", "host")
}

// In dra mode the host name comes from host-device's alias, set in this
// ADD; the driver's record of the name at Prepare is the cross-check, and
// a difference is logged.
func TestDRAHostNetdevCrossCheck(t *testing.T) {
	e, p, _, dir := draEnv(t)
	if err := drarecord.Dir(dir).Write(&drarecord.Claim{Version: 1, ClaimUID: "claim-1", PodUID: draPod, Devices: []drarecord.Device{
		{Request: "nics", PCIAddress: "0000:00:05.0", Netdev: "eth7"},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.add(p, e.draConf(p, map[string]any{}, nil), podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	if recs := e.records(); len(recs) != 1 || recs[0].HostNetdev != "eth2" || recs[0].NetdevParent != "virtio/virtio2" {
		t.Fatalf("records %+v, want host netdev eth2 behind virtio/virtio2", recs)
	}
	if !strings.Contains(e.log.String(), `the DRA driver recorded "eth7"`) {
		t.Fatalf("log does not name the driver's name:\n%s", e.log)
	}
}

// A NIC no longer in the pod (host-device's DEL of an earlier try took it
// out) leaves nothing to restore: DEL succeeds.
func TestDelNICAlreadyOut(t *testing.T) {
	e := newEnv(t)
	e.hostNICs()
	p := e.newPod("c1", "net1", "", "")
	conf := e.chainAdd(p, "0000:00:04.0")
	if err := e.kernel.hostDeviceDel(p.path(), "net1"); err != nil {
		t.Fatal(err)
	}
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rxe1", "host")
	e.wantLinks("", "eth1[]@virtio/virtio1 eth2[]@virtio/virtio2")
	if !strings.Contains(e.log.String(), "not in the pod") {
		t.Fatalf("log does not say the NIC is gone:\n%s", e.log)
	}
}

// A record without the NIC's host name (an older build's, or a NIC that
// had no alias at ADD) leaves the link as the pod left it, and says so.
func TestDelWithoutRecordedHostNetdev(t *testing.T) {
	e := newEnv(t)
	e.hostNICs()
	p := e.newPod("c1", "net1", "", "")
	conf := e.chainAdd(p, "0000:00:04.0")
	st, err := state.New(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.records()[0]
	rec.HostNetdev, rec.NetdevParent = "", ""
	if err := st.Put(rec); err != nil {
		t.Fatal(err)
	}
	e.kernel.setLink(p.path(), "net1", func(l *fakeNetdev) { l.alias = "eth9" })
	if err := e.del(p, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.wantWhere("rxe1", "host")
	e.wantLinks(p.path(), "net1[eth9]@virtio/virtio1")
	if !strings.Contains(e.log.String(), "no host name of the NIC") {
		t.Fatalf("log does not say why nothing was restored:\n%s", e.log)
	}
}
