package linkconf

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); _ = testutils.UnmountNS(n) })
	return n
}

// A rail NIC's host configuration, as a node's network configuration
// sets it: an address of its rail, a route through the rail's gateway,
// and a source-routing table of its own.
func setUpRail(t *testing.T, host ns.NetNS) {
	t.Helper()
	err := host.Do(func(ns.NetNS) error {
		// A veth stands in for the NIC (the host kernel of the unit
		// tests has no dummy links); its peer stays in the host, up.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rail7", MTU: 4200}, PeerName: "rail7p"}); err != nil {
			return err
		}
		for _, n := range []string{"rail7p", "rail7"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("rail7")
		if err != nil {
			return err
		}
		for _, a := range []string{"10.100.47.5/24", "fd00:47::5/64"} {
			ad, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(l, ad); err != nil {
				return err
			}
		}
		_, dst, _ := net.ParseCIDR("10.200.0.0/16")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: net.ParseIP("10.100.47.254"), Priority: 20}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("10.100.47.254"), Table: 147})
	})
	if err != nil {
		t.Fatal(err)
	}
}

func move(t *testing.T, from, to ns.NetNS, name string) {
	t.Helper()
	if err := from.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(to.Fd()))
	}); err != nil {
		t.Fatal(err)
	}
}

// What Read takes from the host, a move drops, ApplyPod carries into the
// pod (the main table's routes only) and Restore gives the host back,
// exactly.
func TestCarryAndRestore(t *testing.T) {
	host, pod := newNS(t), newNS(t)
	setUpRail(t, host)
	var before Config
	if err := host.Do(func(ns.NetNS) (err error) { before, err = Read("rail7"); return err }); err != nil {
		t.Fatal(err)
	}
	if !before.Up || before.MTU != 4200 || len(before.Addrs) != 2 || len(before.Routes) != 2 {
		t.Fatalf("Read: %+v, want up, MTU 4200, the two addresses and the two routes the rail has", before)
	}
	move(t, host, pod, "rail7")
	if err := pod.Do(func(ns.NetNS) error {
		l, _ := netlink.LinkByName("rail7")
		return netlink.LinkSetUp(l)
	}); err != nil {
		t.Fatal(err)
	}
	one, two := 1, 2
	if err := ApplyPod(pod.Path(), "rail7", Pod{Host: &before, MTU: 9000, ARP: &ARP{Ignore: &one, Announce: &two}}); err != nil {
		t.Fatal(err)
	}
	var inPod Config
	var arp string
	if err := pod.Do(func(ns.NetNS) (err error) {
		b1, _ := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf/rail7/arp_ignore"))
		b2, _ := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf/rail7/arp_announce"))
		arp = strings.TrimSpace(string(b1)) + "/" + strings.TrimSpace(string(b2))
		inPod, err = Read("rail7")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := before
	want.MTU = 9000
	want.Routes = []Route{before.Routes[0]}
	if before.Routes[0].Table != 254 {
		want.Routes = []Route{before.Routes[1]}
	}
	if !reflect.DeepEqual(inPod, want) || arp != "1/2" {
		t.Fatalf("in the pod %+v (arp %s)\nwant %+v (arp 1/2)", inPod, arp, want)
	}
	move(t, pod, host, "rail7")
	var after Config
	if err := host.Do(func(ns.NetNS) error {
		if err := Restore("rail7", before); err != nil {
			return err
		}
		if err := Restore("rail7", before); err != nil { // DEL retried
			return err
		}
		var err error
		after, err = Read("rail7")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after, before) {
		t.Fatalf("restored %+v\nwant %+v", after, before)
	}
}

// Without Restore the move leaves the host nothing of it: what the test
// above restores is not there by itself.
func TestMoveDropsConfig(t *testing.T) {
	host, pod := newNS(t), newNS(t)
	setUpRail(t, host)
	move(t, host, pod, "rail7")
	move(t, pod, host, "rail7")
	var after Config
	if err := host.Do(func(ns.NetNS) (err error) { after, err = Read("rail7"); return err }); err != nil {
		t.Fatal(err)
	}
	if after.Up || len(after.Addrs) != 0 || len(after.Routes) != 0 {
		t.Fatalf("after two moves %+v: the kernel kept something", after)
	}
}

func TestNetdevOfPCI(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"0000:3b:00.0/net/ens1f0", "0000:00:04.0/virtio1/net/eth1", "0000:00:05.0"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for pci, want := range map[string]string{"0000:3b:00.0": "ens1f0", "0000:00:04.0": "eth1"} {
		if got, err := NetdevOfPCI(root, pci); err != nil || got != want {
			t.Errorf("NetdevOfPCI(%s) = %q, %v; want %s", pci, got, err, want)
		}
	}
	if _, err := NetdevOfPCI(root, "0000:00:05.0"); err == nil || !strings.Contains(err.Error(), "no netdev in the host") {
		t.Errorf("a function without a netdev: %v", err)
	}
}
