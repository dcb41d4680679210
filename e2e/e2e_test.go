//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

func requireMode(t *testing.T, want string) {
	t.Helper()
	mode, err := netlink.RdmaSystemGetNetnsMode()
	if err != nil {
		t.Fatalf("read RDMA netns mode: %v", err)
	}
	if mode != want {
		t.Skipf("needs a VM booted in %s mode (this one is %s)", want, mode)
	}
}

// The seed case on each device layout: host-device moves the NIC into the
// pod as net1, rdma-netns moves its RDMA device after it; DEL undoes both.
func TestSeedChain(t *testing.T) {
	requireMode(t, "exclusive")
	for _, layout := range []string{"pf", "child", "udev"} {
		t.Run(layout, func(t *testing.T) {
			n := nicBy(t, layout)
			c := cni(t)
			l := chain(t, "rdma-net", n.Netdev, 1, nil)
			p := newPod(t, "seed-"+layout)
			res := mustAdd(t, c, l, p.rt("net1"))

			wantRDMA(t, n.RDMA, []string{p.path()}, []string{""})
			wantNetdev(t, "net1", p.path())
			if nd, err := rdmaLinkNetdev(p.path(), n.RDMA); err != nil || nd != "net1" {
				t.Fatalf("`rdma link` in the pod shows netdev %q on %s/1 (%v), want net1", nd, n.RDMA, err)
			}
			r, err := current.NewResultFromResult(res)
			if err != nil || len(r.Interfaces) == 0 || r.Interfaces[0].Name != "net1" || len(r.IPs) != 1 {
				t.Fatalf("chain result lost host-device's interface or IP: %+v (%v)", res, err)
			}
			if err := c.CheckNetworkList(context.Background(), l, p.rt("net1")); err != nil {
				t.Fatalf("CHECK on a healthy pod: %v", err)
			}

			mustDelHome(t, c, l, p, n)
		})
	}
}

// Multus and device plugins name the device by ID; operators by name.
func TestDeviceSelection(t *testing.T) {
	requireMode(t, "exclusive")
	n := nicBy(t, "pf")
	other := nicBy(t, "child")
	cases := []struct {
		name  string
		extra map[string]any
		caps  map[string]any
		want  nic
	}{
		{"top-level deviceID", map[string]any{"deviceID": n.PCI}, nil, n},
		{"pciBusID", map[string]any{"pciBusID": n.PCI}, nil, n},
		// A pod's own deviceID (Multus passes it as runtimeConfig.deviceID),
		// on a network whose allowedPodDevices let the pod pick that device.
		{"runtimeConfig.deviceID", map[string]any{"capabilities": map[string]bool{"deviceID": true}, "allowedPodDevices": []string{n.RDMA}}, map[string]any{"deviceID": n.PCI}, n},
		// The netdev is n's, but the operator names another device.
		{"explicit rdmaDevice", map[string]any{"rdmaDevice": other.RDMA}, nil, other},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cni(t)
			l := chain(t, "rdma-sel", n.Netdev, 2, tc.extra)
			p := newPod(t, "sel")
			rt := p.rt("net1")
			rt.CapabilityArgs = tc.caps
			mustAdd(t, c, l, rt)
			wantRDMA(t, tc.want.RDMA, []string{p.path()}, []string{""})
			mustDel(t, c, l, rt)
			wantRDMA(t, tc.want.RDMA, []string{""}, []string{p.path()})
			wantNoRecords(t)
		})
	}
}

func TestCheckDetectsDeviceTakenAway(t *testing.T) {
	requireMode(t, "exclusive")
	n, c, l, p := attachedPod(t, "child", "rdma-check", 3, nil, "check")
	// Someone on the node takes the device back behind the plugin's back.
	moveOutByNetlink(t, p.path(), n.RDMA)
	wantRDMA(t, n.RDMA, []string{""}, []string{p.path()})
	err := c.CheckNetworkList(context.Background(), l, p.rt("net1"))
	wantErrContains(t, err, n.RDMA, "no longer in the pod")
	mustDel(t, c, l, p.rt("net1"))
	wantNetdev(t, n.Netdev, "")
	wantNoRecords(t)
}

// moveOutByNetlink moves a device from a pod to the host, from inside the
// pod as the kernel requires.
func moveOutByNetlink(t *testing.T, nsPath, dev string) {
	t.Helper()
	err := ns.WithNetNSPath(nsPath, func(host ns.NetNS) error {
		link, err := netlink.RdmaLinkByName(dev)
		if err != nil {
			return err
		}
		return netlink.RdmaLinkSetNsFd(link, uint32(host.Fd()))
	})
	if err != nil {
		t.Fatalf("move %s out of the pod: %v", dev, err)
	}
}

func TestRepeatedAddAndDel(t *testing.T) {
	requireMode(t, "exclusive")
	n := nicBy(t, "pf")
	c := cni(t)
	l := conflist(t, "rdma-twice", rdmaPlugin(nil))
	p := newPod(t, "twice")
	// host-device cannot ADD twice, so drive the rdma-netns step alone with
	// the prevResult host-device would have produced.
	hd := chain(t, "rdma-twice", n.Netdev, 4, nil)
	hd.Plugins = hd.Plugins[:1]
	res := mustAdd(t, c, hd, p.rt("net1"))
	for i := 0; i < 2; i++ {
		if _, err := c.AddNetwork(context.Background(), withPrev(t, l.Name, l.Plugins[0], res), p.rt("net1")); err != nil {
			t.Fatalf("ADD %d: %v\n%s", i, err, tailLog())
		}
		wantRDMA(t, n.RDMA, []string{p.path()}, []string{""})
	}
	for i := 0; i < 2; i++ {
		if err := c.DelNetwork(context.Background(), withPrev(t, l.Name, l.Plugins[0], res), p.rt("net1")); err != nil {
			t.Fatalf("DEL %d: %v\n%s", i, err, tailLog())
		}
		wantRDMA(t, n.RDMA, []string{""}, []string{p.path()})
	}
	mustDel(t, c, hd, p.rt("net1"))
	wantNoRecords(t)
}

// withPrev is the plugin config libcni would build with prevResult and the
// list's name and version.
func withPrev(t *testing.T, name string, plugin *libcni.PluginConfig, prev types.Result) *libcni.PluginConfig {
	t.Helper()
	inject := map[string]any{"cniVersion": "1.1.0", "name": name}
	if prev != nil {
		r, err := prev.GetAsVersion("1.1.0")
		if err != nil {
			t.Fatal(err)
		}
		inject["prevResult"] = r
	}
	pc, err := libcni.InjectConf(plugin, inject)
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// The pod netns is destroyed before DEL: the kernel returns the netdev and
// the RDMA device to the host, and DEL must still clean up and succeed,
// whether the runtime passes the dead netns path or none.
func TestDelAfterNetnsDeleted(t *testing.T) {
	requireMode(t, "exclusive")
	for _, netnsArg := range []string{"dead path", "empty"} {
		t.Run(netnsArg, func(t *testing.T) {
			n := nicBy(t, "child")
			c := cni(t)
			l := chain(t, "rdma-gone", n.Netdev, 5, nil)
			p := newPod(t, "gone")
			rt := p.rt("net1")
			mustAdd(t, c, l, rt)
			p.destroy()
			wantRDMA(t, n.RDMA, []string{""}, nil)
			wantNetdev(t, n.Netdev, "")
			if len(records()) != 1 {
				t.Fatal("the attachment record should still be there before DEL")
			}
			if netnsArg == "empty" {
				rt.NetNS = ""
				mustDel(t, c, l, rt)
			} else {
				// host-device cannot DEL from a dead netns, so run our step alone.
				only := conflist(t, "rdma-gone", rdmaPlugin(nil))
				if err := c.DelNetwork(context.Background(), withPrev(t, only.Name, only.Plugins[0], nil), rt); err != nil {
					t.Fatalf("DEL with a dead netns path: %v\n%s", err, tailLog())
				}
			}
			wantRDMA(t, n.RDMA, []string{""}, nil)
			wantNoRecords(t)
		})
	}
}

func TestDelAfterDeviceVanished(t *testing.T) {
	requireMode(t, "exclusive")
	n, c, l, p := attachedPod(t, "pf", "rdma-vanish", 6, nil, "vanish")
	// The driver unbinds (firmware reset, hot unplug): the device is gone.
	if err := ns.WithNetNSPath(p.path(), func(ns.NetNS) error { return netlink.RdmaLinkDel(n.RDMA) }); err != nil {
		t.Fatalf("remove %s: %v", n.RDMA, err)
	}
	mustDel(t, c, l, p.rt("net1"))
	wantNetdev(t, n.Netdev, "")
	wantNoRecords(t)
	recreate(t, n)
}

// recreate brings a removed soft-RoCE device back with its original layout.
func recreate(t *testing.T, n nic) {
	t.Helper()
	mode := "2"
	if n.Layout == "child" {
		mode = "1"
	}
	if err := writeParam("parent", mode); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RdmaLinkAdd(n.RDMA, "rxe", n.Netdev); err != nil {
		t.Fatalf("recreate %s on %s: %v", n.RDMA, n.Netdev, err)
	}
}

func TestDeviceOwnedByAnotherPod(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := nics[0], nics[1]
	c := cni(t)
	la := chain(t, "rdma-own", a.Netdev, 7, nil)
	pa := newPod(t, "owner")
	mustAdd(t, c, la, pa.rt("net1"))

	// Pod B's chain brings its own NIC but asks for A's device.
	lb := chain(t, "rdma-own", b.Netdev, 8, map[string]any{"rdmaDevice": a.RDMA})
	pb := newPod(t, "intruder")
	_, err := add(t, c, lb, pb.rt("net1"))
	wantErrContains(t, err, a.RDMA, "rdma-own/owner/net1")
	wantRDMA(t, a.RDMA, []string{pa.path()}, []string{"", pb.path()})
	wantRDMA(t, b.RDMA, []string{""}, []string{pb.path()})
	// The runtime cleans up the failed ADD; the owner is untouched.
	mustDel(t, c, lb, pb.rt("net1"))
	wantRDMA(t, a.RDMA, []string{pa.path()}, nil)
	mustDel(t, c, la, pa.rt("net1"))
	wantNoRecords(t)
}

// A chain whose netdev is virtual has no RDMA device to move.
func TestVethHasNoRDMADevice(t *testing.T) {
	requireMode(t, "exclusive")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vethpod0"}, PeerName: "vethhost0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vethhost0"}})
	before, _ := rdmaDevs("")
	c := cni(t)
	l := chain(t, "rdma-veth", "vethpod0", 9, nil)
	p := newPod(t, "veth")
	_, err := add(t, c, l, p.rt("net1"))
	wantErrContains(t, err, "net1", "no parent device")
	if after, _ := rdmaDevs(""); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("host RDMA devices changed: %v -> %v", before, after)
	}
	wantNoRecords(t)
	mustDel(t, c, l, p.rt("net1"))
}

// Eight pods attach at once, then detach at once.
func TestParallelPods(t *testing.T) {
	requireMode(t, "exclusive")
	count := 8
	if len(nics) < count {
		count = len(nics)
	}
	c := cni(t)
	type att struct {
		n   nic
		p   *pod
		l   *libcni.NetworkConfigList
		err error
	}
	atts := make([]*att, count)
	for i := range atts {
		atts[i] = &att{n: nics[i], p: newPod(t, fmt.Sprintf("par%d", i)), l: chain(t, "rdma-par", nics[i].Netdev, 20+i, nil)}
	}
	run := func(f func(a *att) error) {
		var wg sync.WaitGroup
		for _, a := range atts {
			wg.Add(1)
			go func(a *att) { defer wg.Done(); a.err = f(a) }(a)
		}
		wg.Wait()
	}
	start := time.Now()
	run(func(a *att) error { _, err := add(t, c, a.l, a.p.rt("net1")); return err })
	t.Logf("%d parallel ADDs took %v", count, time.Since(start))
	for _, a := range atts {
		if a.err != nil {
			t.Errorf("ADD %s: %v", a.p.id, a.err)
			continue
		}
		wantRDMA(t, a.n.RDMA, []string{a.p.path()}, []string{""})
	}
	if got := len(records()); got != count {
		t.Errorf("%d records, want %d", got, count)
	}
	run(func(a *att) error { return del(t, c, a.l, a.p.rt("net1")) })
	for _, a := range atts {
		if a.err != nil {
			t.Errorf("DEL %s: %v", a.p.id, a.err)
		}
		wantRDMA(t, a.n.RDMA, []string{""}, []string{a.p.path()})
		wantNetdev(t, a.n.Netdev, "")
	}
	wantNoRecords(t)
}

// GC returns the devices of attachments the runtime no longer knows.
func TestGC(t *testing.T) {
	requireMode(t, "exclusive")
	c := cni(t)
	var pods []*pod
	var lists []*libcni.NetworkConfigList
	for i := 0; i < 3; i++ {
		pods = append(pods, newPod(t, fmt.Sprintf("gc%d", i)))
		lists = append(lists, chain(t, "rdma-gc", nics[i].Netdev, 40+i, nil))
		mustAdd(t, c, lists[i], pods[i].rt("net1"))
	}
	// Call the plugin's GC directly: libcni's GC would first DEL the stale
	// attachments from its own cache, and we want rdma-netns to do the work.
	gcConf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rdma-gc","type":"rdma-netns","logFile":%q,"logLevel":"debug",
		"cni.dev/valid-attachments":[{"containerID":"gc0","ifname":"net1"}]}`, logFile))
	if err := execPlugin("GC", gcConf); err != nil {
		t.Fatalf("GC: %v\n%s", err, tailLog())
	}
	wantRDMA(t, nics[0].RDMA, []string{pods[0].path()}, []string{""})
	for i := 1; i < 3; i++ {
		wantRDMA(t, nics[i].RDMA, []string{""}, []string{pods[i].path()})
	}
	if got := len(records()); got != 1 {
		t.Fatalf("%d records after GC, want 1", got)
	}
	for i := range pods {
		mustDel(t, c, lists[i], pods[i].rt("net1"))
	}
	wantNoRecords(t)
}

func TestStatusExclusive(t *testing.T) {
	requireMode(t, "exclusive")
	c := cni(t)
	l := chain(t, "rdma-status", nics[0].Netdev, 50, nil)
	if err := c.GetStatusNetworkList(context.Background(), l); err != nil {
		t.Fatalf("STATUS in exclusive mode: %v", err)
	}
}

// Shared mode: a separate boot of the VM (make e2e does both).
func TestSharedMode(t *testing.T) {
	requireMode(t, "shared")
	n := nics[0]
	c := cni(t)
	l := chain(t, "rdma-shared", n.Netdev, 60, nil)
	err := c.GetStatusNetworkList(context.Background(), l)
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS in shared mode = %v, want error 50 (not available)", err)
	}
	p := newPod(t, "shared")
	_, err = add(t, c, l, p.rt("net1"))
	wantErrContains(t, err, "shared netns mode", "options ib_core netns_mode=0", "rdma system set netns exclusive")
	wantNoRecords(t)
	mustDel(t, c, l, p.rt("net1"))
	wantNetdev(t, n.Netdev, "")
}
