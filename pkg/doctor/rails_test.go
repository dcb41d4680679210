package doctor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
)

// railsNS is a test network namespace holding one netdev per rail, as a
// pod with several RDMA NICs has after its chains ran.
type railsNS struct {
	ns ns.NetNS
}

// newRailsNS creates a netns with one netdev per entry of rails (name,
// address with prefix), up, with its address. The netdevs are veths whose
// peers (no address) stay in the netns too: kernels built without the
// dummy driver have veth.
func newRailsNS(t *testing.T, rails [][2]string) *railsNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	rn := &railsNS{ns: n}
	rn.do(t, func() error {
		for _, r := range rails {
			if err := addVeth(r[0]); err != nil {
				return err
			}
			l, err := netlink.LinkByName(r[0])
			if err != nil {
				return err
			}
			a, err := netlink.ParseAddr(r[1])
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("address %s on %s: %w", r[1], r[0], err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	return rn
}

// addVeth adds name and its peer name+"p", both up.
func addVeth(name string) error {
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		return fmt.Errorf("veth %s: %w", name, err)
	}
	for _, n := range []string{name + "p", name} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	return nil
}

func (rn *railsNS) do(t *testing.T, fn func() error) {
	t.Helper()
	if err := rn.ns.Do(func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

// sysctl sets net.ipv4.conf.<dev>.<key> inside the netns. The test's
// netdevs exist only there, so a write that reached the host's /proc/sys
// would fail rather than change the host.
func (rn *railsNS) sysctl(t *testing.T, dev, key string, v int) {
	t.Helper()
	rn.do(t, func() error {
		return os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", dev, key), []byte(fmt.Sprint(v)), 0o644)
	})
}

func (rn *railsNS) arp(t *testing.T, devs []string, ignore, announce int) {
	t.Helper()
	for _, d := range devs {
		rn.sysctl(t, d, "arp_ignore", ignore)
		rn.sysctl(t, d, "arp_announce", announce)
	}
}

// sbr does what the sbr plugin does for dev: a routing table of its own
// with the subnet route, and a rule sending what comes from its address
// there.
func (rn *railsNS) sbr(t *testing.T, dev, cidr string, table int) {
	t.Helper()
	rn.do(t, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		ip, subnet, err := net.ParseCIDR(cidr)
		if err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: subnet, Src: ip, Scope: netlink.SCOPE_LINK, Table: table}); err != nil {
			return fmt.Errorf("route in table %d: %w", table, err)
		}
		rule := netlink.NewRule()
		rule.Src = &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}
		rule.Table = table
		if err := netlink.RuleAdd(rule); err != nil {
			return fmt.Errorf("rule from %s: %w", ip, err)
		}
		return nil
	})
}

// check runs the rails check on the netns as the doctor does in a pod,
// for the rails devs.
func (rn *railsNS) check(t *testing.T, devs []RailDev) (*Report, []Rail) {
	t.Helper()
	r := &Report{}
	var rails []Rail
	if err := railNetIn(rn.ns.Path(), func(n RailNet) error {
		rails = checkRails(&r.Findings, n, devs, rn.ns.Path())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.finish()
	return r, rails
}

// withGIDs pairs each rail with an RDMA device holding a RoCE v2 (and a
// RoCE v1) GID for its address, as the kernel makes them.
func withGIDs(rails [][2]string) []RailDev {
	var devs []RailDev
	for i, r := range rails {
		a := netip.MustParsePrefix(r[1]).Addr().String()
		devs = append(devs, RailDev{Device: fmt.Sprintf("mlx5_%d", i), Port: 1, Netdev: r[0], GIDs: []GID{
			{Index: 2, Address: a, Type: "IB/RoCE v1", Netdev: r[0]},
			{Index: 3, Address: a, Type: RoCEv2, Netdev: r[0]},
		}})
	}
	return devs
}

func subjects(fs []Finding, sev Severity) []string {
	var out []string
	for _, f := range fs {
		if f.Severity == sev {
			out = append(out, f.Subject)
		}
	}
	return out
}

var sharedRails = [][2]string{{"rail0", "10.20.0.1/24"}, {"rail1", "10.20.0.2/24"}, {"rail2", "10.20.0.3/24"}}

func railNames(rails [][2]string) []string {
	var out []string
	for _, r := range rails {
		out = append(out, r[0])
	}
	return out
}

// Three rails on one subnet with the defaults: every rail answers ARP for
// the others' addresses, and the kernel sends what leaves from two of the
// three addresses out of one netdev. tuning's sysctls clear the ARP
// findings, sbr's tables and rules the route findings.
func TestRailsSharedSubnet(t *testing.T) {
	rn := newRailsNS(t, sharedRails)
	devs := withGIDs(sharedRails)
	names := railNames(sharedRails)
	rn.arp(t, append([]string{"all"}, names...), 0, 0)

	r, rails := rn.check(t, devs)
	if r.ExitCode != 1 {
		t.Fatalf("exit %d, want 1: %+v", r.ExitCode, r.Findings)
	}
	arp := findingsOf(r, "rail-arp")
	if got := subjects(arp, Fail); strings.Join(got, ";") != "mlx5_0 (rail0);mlx5_1 (rail1);mlx5_2 (rail2)" {
		t.Fatalf("rail-arp failures for %v, want every rail: %+v", got, arp)
	}
	for _, f := range arp {
		if !strings.Contains(f.Reason, "answers ARP for other rails' addresses") || !strings.Contains(f.Reason, "arp_ignore 0") || !strings.Contains(f.Reason, "arp_announce 0") ||
			!strings.Contains(f.Remedy, RailsNAD) || !strings.Contains(f.Remedy, "arp_ignore=1") || !strings.Contains(f.Remedy, "arp_announce=2") {
			t.Errorf("rail-arp finding %+v", f)
		}
	}
	routes := findingsOf(r, "rail-route")
	crossed := map[string]bool{}
	for _, f := range routes {
		if f.Severity != Fail || !strings.Contains(f.Remedy, RailsNAD) || !strings.Contains(f.Remedy, "sbr") {
			t.Errorf("rail-route finding %+v", f)
		}
		crossed[f.Subject] = true
	}
	// One connected route per netdev in one table: the kernel picks one
	// netdev for the whole subnet, so the two other rails cross.
	if len(routes) != 2 || len(crossed) != 2 {
		t.Fatalf("rail-route findings %+v, want 2 rails crossing", routes)
	}
	for _, rl := range rails {
		if len(rl.Addresses) != 1 || rl.Addresses[0].Peer != "10.20.0.254" || rl.Addresses[0].RouteNetdev == "" {
			t.Fatalf("rail %+v: want the route to peer 10.20.0.254 asked", rl)
		}
		out := rl.Addresses[0].RouteNetdev
		if crossed[railSubject(&rl)] == (out == rl.Netdev) {
			t.Errorf("rail %s leaves by %s, crossing finding %v", rl.Netdev, out, crossed[railSubject(&rl)])
		}
		if crossed[railSubject(&rl)] {
			f := routes[0]
			if f.Subject != railSubject(&rl) {
				f = routes[1]
			}
			if !strings.Contains(f.Reason, "leaves by netdev "+out) {
				t.Errorf("%+v does not name netdev %s", f, out)
			}
		}
		if strings.Join(rl.SharesSubnetWith, ",") == "" || len(rl.SharesSubnetWith) != 2 {
			t.Errorf("rail %s shares with %v", rl.Netdev, rl.SharesSubnetWith)
		}
		if rl.ArpIgnore != 0 || rl.ArpAnnounce != 0 {
			t.Errorf("rail %s arp %d/%d", rl.Netdev, rl.ArpIgnore, rl.ArpAnnounce)
		}
	}
	if len(findingsOf(r, "rails")) != 0 {
		t.Errorf("a summary OK among failures: %+v", findingsOf(r, "rails"))
	}

	// tuning's sysctls on each rail: ARP is fine, each rail's OK says
	// so; routing still crosses.
	rn.arp(t, names, 1, 2)
	r, rails = rn.check(t, devs)
	if ok := subjects(findingsOf(r, "rail-arp"), OK); strings.Join(ok, ";") != "mlx5_0 (rail0);mlx5_1 (rail1);mlx5_2 (rail2)" ||
		len(findingsOf(r, "rail-arp")) != 3 || len(findingsOf(r, "rail-route")) != 2 || r.ExitCode != 1 {
		t.Fatalf("after arp_ignore=1 arp_announce=2: %+v", r.Findings)
	}
	if f := findingsOf(r, "rail-arp")[0]; !strings.Contains(f.Reason, "shares a subnet with rail1, rail2, and with arp_ignore 1 and arp_announce 2") {
		t.Errorf("rail-arp OK %+v", f)
	}
	if rails[1].ArpIgnore != 1 || rails[1].ArpAnnounce != 2 {
		t.Fatalf("rail %+v", rails[1])
	}

	// sbr: each rail's address routed by its own table.
	for i, rl := range sharedRails {
		rn.sbr(t, rl[0], rl[1], 100+i)
	}
	r, rails = rn.check(t, devs)
	if r.ExitCode != 0 || r.Summary[Warn] != 0 || len(findingsOf(r, "rail-route")) != 0 {
		t.Fatalf("with tuning and sbr: %+v", r.Findings)
	}
	for _, rl := range rails {
		if rl.Addresses[0].RouteNetdev != rl.Netdev {
			t.Errorf("rail %s leaves by %s with sbr", rl.Netdev, rl.Addresses[0].RouteNetdev)
		}
	}
	if ok := findingsOf(r, "rails"); len(ok) != 1 || ok[0].Severity != OK || ok[0].Subject != "rail0 rail1 rail2" {
		t.Fatalf("summary %+v", ok)
	}

	// The kernel applies the larger of all and the netdev's value: all
	// at 0 with the netdevs at 1/2 passed above; the netdevs at 0 with all
	// at 1/2 passes too, and either below fails.
	rn.arp(t, names, 0, 0)
	rn.arp(t, []string{"all"}, 1, 2)
	if r, _ = rn.check(t, devs); len(subjects(findingsOf(r, "rail-arp"), OK)) != 3 || len(findingsOf(r, "rail-arp")) != 3 {
		t.Fatalf("all=1/2: %+v", findingsOf(r, "rail-arp"))
	}
	rn.arp(t, []string{"all"}, 1, 1)
	r, _ = rn.check(t, devs)
	if a := findingsOf(r, "rail-arp"); len(a) != 3 || strings.Contains(a[0].Reason, "arp_ignore 1") || !strings.Contains(a[0].Reason, "arp_announce 1") {
		t.Fatalf("all=1/1: %+v", a)
	}
}

// Two rails sharing a subnet; the pod's own addresses are never the peer.
func TestRailsPeerIsNotThePods(t *testing.T) {
	rails := [][2]string{{"rail0", "10.30.0.254/24"}, {"rail1", "10.30.0.253/24"}}
	rn := newRailsNS(t, rails)
	_, got := rn.check(t, withGIDs(rails))
	for _, rl := range got {
		if rl.Addresses[0].Peer != "10.30.0.252" {
			t.Fatalf("rail %+v: peer %s", rl, rl.Addresses[0].Peer)
		}
	}
}

// Rails each on a subnet of their own (rail-optimized) need none of it:
// no ARP or route failure even with the defaults, an OK per rail's ARP
// and one naming every rail that says so.
func TestRailsOwnSubnets(t *testing.T) {
	rails := [][2]string{{"rail0", "10.40.0.1/24"}, {"rail1", "10.40.1.1/24"}}
	rn := newRailsNS(t, rails)
	rn.arp(t, append([]string{"all"}, railNames(rails)...), 0, 0)
	r, got := rn.check(t, withGIDs(rails))
	if r.ExitCode != 0 || r.Summary[Warn] != 0 || len(findingsOf(r, "rail-route")) != 0 {
		t.Fatalf("%+v", r.Findings)
	}
	if arp := findingsOf(r, "rail-arp"); strings.Join(subjects(arp, OK), ";") != "mlx5_0 (rail0);mlx5_1 (rail1)" || len(arp) != 2 || !strings.Contains(arp[0].Reason, "no other rail of the pod is on its IPv4 subnet") {
		t.Fatalf("rail-arp %+v", arp)
	}
	ok := findingsOf(r, "rails")
	if len(ok) != 1 || ok[0].Severity != OK || ok[0].Subject != "rail0 rail1" || !strings.Contains(ok[0].Reason, "subnet of its own") {
		t.Fatalf("summary %+v", ok)
	}
	for _, rl := range got {
		if len(rl.SharesSubnetWith) != 0 || rl.Addresses[0].Peer != "" {
			t.Errorf("rail %+v", rl)
		}
	}
}

// A pod with both kinds, as the two-node suite's job holds them: two
// rails on subnets of their own, two sharing one with tuning's sysctls and
// sbr's tables. A clean report names every rail: an OK rail-gid and
// rail-arp each, and one rails OK whose subject is every rail's netdev.
func TestRailsBothKinds(t *testing.T) {
	rails := [][2]string{{"net1", "10.70.10.1/24"}, {"net2", "10.70.11.1/24"}, {"net3", "10.70.20.1/24"}, {"net4", "10.70.20.11/24"}}
	rn := newRailsNS(t, rails)
	rn.arp(t, []string{"all", "net1", "net2"}, 0, 0)
	rn.arp(t, []string{"net3", "net4"}, 1, 2)
	rn.sbr(t, "net3", rails[2][1], 100)
	rn.sbr(t, "net4", rails[3][1], 101)
	r, _ := rn.check(t, withGIDs(rails))
	if r.ExitCode != 0 || r.Summary[Warn] != 0 || r.Summary[Fail] != 0 {
		t.Fatalf("%+v", r.Findings)
	}
	every := "mlx5_0 (net1);mlx5_1 (net2);mlx5_2 (net3);mlx5_3 (net4)"
	for _, check := range []string{"rail-gid", "rail-arp"} {
		if got := subjects(findingsOf(r, check), OK); strings.Join(got, ";") != every {
			t.Errorf("%s OK for %v, want every rail", check, got)
		}
	}
	ok := findingsOf(r, "rails")
	if len(ok) != 1 || ok[0].Subject != "net1 net2 net3 net4" || !strings.Contains(ok[0].Reason, "net1 net2 on IPv4 subnets of their own; net3 net4 sharing a subnet") {
		t.Fatalf("summary %+v", ok)
	}
}

// An address without a RoCE v2 GID (only RoCE v1, or none) fails for its
// rail; a netdev without an IPv4 address is a warning.
func TestRailsGIDs(t *testing.T) {
	rails := [][2]string{{"rail0", "10.50.0.1/24"}, {"rail1", "10.50.1.1/24"}}
	rn := newRailsNS(t, rails)
	rn.do(t, func() error { return addVeth("rail2") })
	devs := withGIDs(rails)
	devs[1].GIDs = devs[1].GIDs[:1] // RoCE v1 only
	devs = append(devs, RailDev{Device: "mlx5_2", Port: 1, Netdev: "rail2"})
	r, got := rn.check(t, devs)
	if r.ExitCode != 1 {
		t.Fatalf("exit %d: %+v", r.ExitCode, r.Findings)
	}
	g := findingsOf(r, "rail-gid")
	if len(g) != 2 || g[0].Severity != OK || g[0].Subject != "mlx5_0 (rail0)" || !strings.Contains(g[0].Reason, "10.50.0.1/24 GID 3") ||
		g[1].Severity != Fail || g[1].Subject != "mlx5_1 (rail1)" || !strings.Contains(g[1].Reason, "no RoCE v2 GID for 10.50.1.1/24") {
		t.Fatalf("rail-gid %+v", g)
	}
	if a := findingsOf(r, "rail-addr"); len(a) != 1 || a[0].Severity != Warn || a[0].Subject != "mlx5_2 (rail2)" {
		t.Fatalf("rail-addr %+v", a)
	}
	if *got[0].Addresses[0].RoCEv2GID != 3 || got[1].Addresses[0].RoCEv2GID != nil {
		t.Fatalf("rails %+v", got)
	}
}

func TestPeerIn(t *testing.T) {
	own := map[netip.Addr]bool{netip.MustParseAddr("10.0.0.254"): true}
	for _, c := range []struct {
		prefix, want string
	}{
		{"10.0.0.1/24", "10.0.0.253"},
		{"10.0.1.1/24", "10.0.1.254"},
		{"10.0.0.4/31", "10.0.0.5"},
		{"10.0.0.5/31", "10.0.0.5"},
		{"10.0.0.1/32", ""},
		{"10.0.0.1/30", "10.0.0.2"},
	} {
		got, ok := peerIn(netip.MustParsePrefix(c.prefix), own)
		if (c.want == "") == ok || (ok && got.String() != c.want) {
			t.Errorf("peerIn(%s) = %v %v, want %q", c.prefix, got, ok, c.want)
		}
	}
}

// The pod view pairs each RDMA device with its netdev and GIDs from
// sysfs, asks the pod's netns, and reports the rails as text and JSON.
func TestPodRails(t *testing.T) {
	rails := [][2]string{{"rail0", "10.60.0.1/24"}, {"rail1", "10.60.0.2/24"}}
	rn := newRailsNS(t, rails)
	rn.arp(t, append([]string{"all"}, railNames(rails)...), 0, 0)

	f := newNodeFixture(t)
	podA := filepath.Join(f.netnsDir, "pod-a")
	tr := f.pods[podA]
	f.kernel.in[podA] = []string{"mlx5_1", "mlx5_5", "mlx5_6"}
	for i, rl := range rails {
		fn := fmt.Sprintf("pci0000:00/0000:00:1%d.0", i)
		dev := fmt.Sprintf("mlx5_%d", 5+i)
		tr.PCI(fn)
		tr.Netdev(fn, rl[0])
		rdmaFixture(t, tr, f.env.DevRoot, fn, dev, rl[0], "4: ACTIVE", 1, 5+i)
		a := netip.MustParsePrefix(rl[1]).Addr().String()
		tr.GID(dev, 1, 2, sysfstest.IPv4GID(a), "IB/RoCE v1", rl[0])
		tr.GID(dev, 1, 3, sysfstest.IPv4GID(a), RoCEv2, rl[0])
	}
	f.env.NetIn = func(nsPath string, fn func(RailNet) error) error {
		if nsPath != podA {
			return fmt.Errorf("unexpected netns %s", nsPath)
		}
		return railNetIn(rn.ns.Path(), fn)
	}

	r := CheckPod(f.env, podA, 0)
	if r.ExitCode != 1 {
		t.Fatalf("exit %d: %+v", r.ExitCode, r.Findings)
	}
	// mlx5_1's netdev net1 is not in the test netns: the kernel cannot
	// say what its addresses are.
	if w := findingsOf(r, "rail-addr"); len(w) != 1 || w[0].Subject != "mlx5_1 (net1)" || w[0].Severity != Warn {
		t.Fatalf("rail-addr %+v", w)
	}
	if got := subjects(findingsOf(r, "rail-arp"), Fail); strings.Join(got, ";") != "mlx5_5 (rail0);mlx5_6 (rail1)" {
		t.Fatalf("rail-arp %v", got)
	}
	if len(findingsOf(r, "rail-route")) != 1 {
		t.Fatalf("rail-route %+v", findingsOf(r, "rail-route"))
	}
	if g := subjects(findingsOf(r, "rail-gid"), OK); len(g) != 2 {
		t.Fatalf("rail-gid %+v", findingsOf(r, "rail-gid"))
	}
	if len(r.Pod.Rails) != 3 || r.Pod.Rails[1].Netdev != "rail0" || *r.Pod.Rails[1].Addresses[0].RoCEv2GID != 3 {
		t.Fatalf("rails %+v", r.Pod.Rails)
	}

	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Rails\n", "ROCE V2 GID", "10.60.0.1/24", "0/0", "10.60.0.254 dev "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	var out, errb bytes.Buffer
	if code := runOn([]string{"--netns", podA, "--json"}, &out, &errb, f.env); code != 1 {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
	var doc struct {
		Pod struct {
			Rails []Rail `json:"rails"`
		} `json:"pod"`
		Findings []Finding `json:"findings"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Pod.Rails) != 3 || doc.Pod.Rails[2].SharesSubnetWith[0] != "rail0" || doc.Pod.Rails[2].Addresses[0].Peer != "10.60.0.254" {
		t.Fatalf("JSON rails %+v", doc.Pod.Rails)
	}
	if testing.Verbose() {
		t.Logf("text:\n%s\njson:\n%s", text.String(), out.String())
	}
}
