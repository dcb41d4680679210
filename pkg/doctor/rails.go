package doctor

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// A pod with several RDMA NICs ("rails", one per GPU) whose netdevs share
// one IPv4 subnet breaks RoCE unless ARP and routing keep each rail's
// address on its own NIC: with arp_ignore 0 every rail answers ARP for
// every address of the pod, so a peer can learn rail 1's MAC for rail 2's
// address, and RoCE v2 packets for rail 2 then reach NIC 1, whose GID
// table does not hold that address (retransmissions, queue pair
// timeouts). The pod's routing must also send what leaves from rail k's
// address out of rail k. tuning (arp_ignore=1, arp_announce=2) and sbr (a
// routing table per interface) chained into each rail's attachment do both.

// RailsNAD is the example attachment that chains tuning and sbr after each
// rail's plugins.
const RailsNAD = "conf/nad-rails-shared-subnet.yaml"

// RailDev is one rail as sysfs shows it: a port of an RDMA device, the
// netdev its GID entries belong to, and the IPv4 GID entries of that
// netdev.
type RailDev struct {
	Device string
	Port   int
	Netdev string
	GIDs   []GID
}

// Rail is one rail as the doctor saw it in the pod's netns.
type Rail struct {
	Device    string        `json:"device"`
	Port      int           `json:"port"`
	Netdev    string        `json:"netdev"`
	Addresses []RailAddress `json:"addresses"`
	// ArpIgnore and ArpAnnounce are the values the kernel applies to the
	// netdev: the larger of net.ipv4.conf.all and net.ipv4.conf.<netdev>;
	// -1 when they could not be read.
	ArpIgnore   int `json:"arpIgnore"`
	ArpAnnounce int `json:"arpAnnounce"`
	// SharesSubnetWith are the other rails' netdevs with an address in a
	// subnet of this rail's.
	SharesSubnetWith []string `json:"sharesSubnetWith,omitempty"`
}

// RailAddress is one IPv4 address of a rail's netdev.
type RailAddress struct {
	// Address is the address with its prefix length (10.0.0.1/24).
	Address string `json:"address"`
	// RoCEv2GID is the index of the RoCE v2 GID entry of the address,
	// nil when the port has none.
	RoCEv2GID *int `json:"rocev2Gid"`
	// Peer is the address on the shared subnet the route was asked for
	// (the highest the pod does not own); RouteNetdev the netdev the
	// kernel sends what leaves from Address to Peer by. Set for rails
	// sharing a subnet only.
	Peer        string `json:"peer,omitempty"`
	RouteNetdev string `json:"routeNetdev,omitempty"`
	RouteError  string `json:"routeError,omitempty"`
}

// railDevs pairs each port of the pod's devices with the netdevs its GID
// entries belong to, leaving out netdevs of another netns.
func railDevs(devs []Device) []RailDev {
	var out []RailDev
	for _, d := range devs {
		for _, p := range d.Ports {
			for _, nd := range p.Netdevs {
				if slices.Contains(p.NetdevsElsewhere, nd) {
					continue
				}
				rd := RailDev{Device: d.Name, Port: p.Port, Netdev: nd}
				for _, g := range p.IPv4GIDs {
					if g.Netdev == nd {
						rd.GIDs = append(rd.GIDs, g)
					}
				}
				out = append(out, rd)
			}
		}
	}
	return out
}

func railSubject(r *Rail) string { return fmt.Sprintf("%s (%s)", r.Device, r.Netdev) }

// checkRails reports, for each rail, whether RoCE v2 can address each of
// its IPv4 addresses and, for rails sharing a subnet, whether ARP and
// routing keep each rail's address on its own NIC. nsPath is the pod's
// netns, for the fixes.
func checkRails(fs *Findings, n RailNet, devs []RailDev, nsPath string) []Rail {
	rails := make([]Rail, 0, len(devs))
	own := map[netip.Addr]bool{}
	if all, err := n.IPv4Addrs(""); err == nil {
		for _, p := range all {
			own[p.Addr()] = true
		}
	}
	unlisted := map[int]bool{}
	for i, d := range devs {
		rl := Rail{Device: d.Device, Port: d.Port, Netdev: d.Netdev, Addresses: []RailAddress{}, ArpIgnore: -1, ArpAnnounce: -1}
		addrs, err := n.IPv4Addrs(d.Netdev)
		if err != nil {
			fs.add(Warn, "rail-addr", railSubject(&rl), fmt.Sprintf("cannot list the IPv4 addresses of %s in the pod's netns: %v", d.Netdev, err),
				"check that the netdev the RDMA device's GIDs name is in the pod (rdma-netns moves the RDMA device with it)")
			unlisted[i] = true
		}
		for _, a := range addrs {
			own[a.Addr()] = true
			ra := RailAddress{Address: a.String()}
			for _, g := range d.GIDs {
				if g.Type == RoCEv2 && g.Address == a.Addr().String() {
					idx := g.Index
					ra.RoCEv2GID = &idx
					break
				}
			}
			rl.Addresses = append(rl.Addresses, ra)
		}
		rl.ArpIgnore = arpConf(n, d.Netdev, "arp_ignore")
		rl.ArpAnnounce = arpConf(n, d.Netdev, "arp_announce")
		rails = append(rails, rl)
	}

	for i := range rails {
		if !unlisted[i] {
			gidFindings(fs, &rails[i])
		}
	}
	groups := sharedSubnets(rails)
	for _, g := range groups {
		for _, i := range g {
			for _, j := range g {
				if i != j && !slices.Contains(rails[i].SharesSubnetWith, rails[j].Netdev) {
					rails[i].SharesSubnetWith = append(rails[i].SharesSubnetWith, rails[j].Netdev)
				}
			}
		}
	}
	grouped := map[int]bool{}
	for _, g := range groups {
		for _, i := range g {
			grouped[i] = true
		}
	}
	// A rail alone on its subnet gets an OK of its own, so that a clean
	// report names every rail's ARP as it names every rail's GIDs.
	crossed := false
	var apart, together []string
	for i := range rails {
		rl := &rails[i]
		switch {
		case grouped[i]:
			together = append(together, rl.Netdev)
			if !arpFinding(fs, rl, nsPath) {
				crossed = true
			}
			if !routeFindings(fs, n, rl, rails, own, nsPath) {
				crossed = true
			}
		case len(rl.Addresses) > 0:
			apart = append(apart, rl.Netdev)
			if len(rails) > 1 {
				fs.add(OK, "rail-arp", railSubject(rl), "no other rail of the pod is on its IPv4 subnet: peers ask ARP for another rail's address on that rail's own subnet, so this rail's ARP settings cannot draw another rail's traffic", "")
			}
		}
	}
	if crossed || len(apart)+len(together) < 2 {
		return rails
	}
	var why string
	switch {
	case len(together) == 0:
		why = "each rail is on an IPv4 subnet of its own (rail-optimized): no rail answers ARP or routes for another's subnet, so arp_ignore, arp_announce and per-rail routing tables are not needed"
	case len(apart) == 0 && len(groups) > 1:
		why = "these rails share subnets, and ARP (arp_ignore >= 1, arp_announce 2) and routing (each rail's address leaves by its own netdev) keep each rail's address on its own NIC"
	case len(apart) == 0:
		why = "these rails share a subnet, and ARP (arp_ignore >= 1, arp_announce 2) and routing (each rail's address leaves by its own netdev) keep each rail's address on its own NIC"
	default:
		why = fmt.Sprintf("%s on IPv4 subnets of their own; %s sharing a subnet, with ARP (arp_ignore >= 1, arp_announce 2) and routing (each rail's address leaves by its own netdev) keeping each rail's address on its own NIC",
			strings.Join(apart, " "), strings.Join(together, " "))
	}
	fs.add(OK, "rails", strings.Join(append(apart, together...), " "), why, "")
	return rails
}

// arpConf is the value the kernel applies to netdev: for arp_ignore and
// arp_announce the larger of "all" and the netdev's own; -1 if unreadable.
func arpConf(n RailNet, netdev, key string) int {
	dev, err := n.ARPConf(netdev, key)
	if err != nil {
		return -1
	}
	all, err := n.ARPConf("all", key)
	if err != nil {
		return -1
	}
	return max(dev, all)
}

func gidFindings(fs *Findings, rl *Rail) {
	subj := railSubject(rl)
	if len(rl.Addresses) == 0 {
		fs.add(Warn, "rail-addr", subj, fmt.Sprintf("netdev %s of %s port %d has no IPv4 address: its GID table has no IPv4 (RoCE v2) entry, so RoCE v2 over IPv4 cannot use this rail", rl.Netdev, rl.Device, rl.Port),
			"give the rail's attachment an IPAM (each rail's NetworkAttachmentDefinition), or check that the pod's IPAM ran")
		return
	}
	var missing, have []string
	for _, a := range rl.Addresses {
		if a.RoCEv2GID == nil {
			missing = append(missing, a.Address)
		} else {
			have = append(have, fmt.Sprintf("%s GID %d", a.Address, *a.RoCEv2GID))
		}
	}
	if len(missing) > 0 {
		fs.add(Fail, "rail-gid", subj, fmt.Sprintf("%s port %d has no RoCE v2 GID for %s of %s: RoCE v2 traffic and rdma_cm cannot use that address on this rail (NCCL finds no usable GID for it, or picks another)",
			rl.Device, rl.Port, strings.Join(missing, ", "), rl.Netdev),
			fmt.Sprintf("the kernel adds a RoCE v2 GID for each IPv4 address of the port's netdev while it is up: check with `rdma link` that port %d of %s is bound to %s, and that the NIC has RoCE v2 enabled", rl.Port, rl.Device, rl.Netdev))
		return
	}
	fs.add(OK, "rail-gid", subj, "RoCE v2 GIDs for every IPv4 address: "+strings.Join(have, ", "), "")
}

// sharedSubnets groups the rails (indices) whose netdevs have addresses in
// overlapping IPv4 prefixes; groups of one are left out.
func sharedSubnets(rails []Rail) [][]int {
	parent := make([]int, len(rails))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		if parent[i] != i {
			parent[i] = find(parent[i])
		}
		return parent[i]
	}
	for i := range rails {
		for j := i + 1; j < len(rails); j++ {
			if rails[i].Netdev != rails[j].Netdev && subnetsOverlap(rails[i], rails[j]) {
				parent[find(j)] = find(i)
			}
		}
	}
	byRoot := map[int][]int{}
	var roots []int
	for i := range rails {
		root := find(i)
		if _, ok := byRoot[root]; !ok {
			roots = append(roots, root)
		}
		byRoot[root] = append(byRoot[root], i)
	}
	var groups [][]int
	for _, root := range roots {
		if len(byRoot[root]) > 1 {
			groups = append(groups, byRoot[root])
		}
	}
	return groups
}

func subnetsOverlap(a, b Rail) bool {
	for _, x := range a.Addresses {
		for _, y := range b.Addresses {
			px, errx := netip.ParsePrefix(x.Address)
			py, erry := netip.ParsePrefix(y.Address)
			if errx == nil && erry == nil && px.Masked().Overlaps(py.Masked()) {
				return true
			}
		}
	}
	return false
}

// arpFinding reports a shared-subnet rail whose ARP settings let it answer
// for, or announce, other rails' addresses; false when it does.
func arpFinding(fs *Findings, rl *Rail, nsPath string) bool {
	subj := railSubject(rl)
	if rl.ArpIgnore >= 1 && rl.ArpAnnounce >= 2 {
		fs.add(OK, "rail-arp", subj, fmt.Sprintf("it shares a subnet with %s, and with arp_ignore %d and arp_announce %d it answers ARP only for its own addresses and asks with them",
			strings.Join(rl.SharesSubnetWith, ", "), rl.ArpIgnore, rl.ArpAnnounce), "")
		return true
	}
	if rl.ArpIgnore < 0 || rl.ArpAnnounce < 0 {
		fs.add(Warn, "rail-arp", subj, fmt.Sprintf("cannot read net.ipv4.conf.%s.arp_ignore/arp_announce (or .all): whether this rail answers ARP for other rails' addresses on its subnet is unknown", rl.Netdev),
			"run the doctor as root")
		return true
	}
	addr := "no address"
	if len(rl.Addresses) > 0 {
		addr = rl.Addresses[0].Address
	}
	var what []string
	if rl.ArpIgnore < 1 {
		what = append(what, fmt.Sprintf("arp_ignore %d (it answers ARP for any of the pod's addresses)", rl.ArpIgnore))
	}
	if rl.ArpAnnounce < 2 {
		what = append(what, fmt.Sprintf("arp_announce %d (its ARP requests may carry another rail's address)", rl.ArpAnnounce))
	}
	fs.add(Fail, "rail-arp", subj,
		fmt.Sprintf("rail %s (%s, %s) answers ARP for other rails' addresses: peers can learn its MAC for them and send that rail's RoCE traffic to the wrong NIC, whose GID table lacks the address (retransmissions, IBV_WC_RETRY_EXC_ERR); it shares a subnet with %s and has %s",
			rl.Device, rl.Netdev, addr, strings.Join(rl.SharesSubnetWith, ", "), strings.Join(what, ", ")),
		fmt.Sprintf("chain tuning and sbr after each rail's plugins, as %s does (tuning: sysctl net.ipv4.conf.IFNAME.arp_ignore=1 and net.ipv4.conf.IFNAME.arp_announce=2), and recreate the pod; "+
			"or give each rail a subnet of its own (rail-optimized); %s",
			RailsNAD, tryARP(nsPath, rl.Netdev)))
	return false
}

// tryIt introduces the command of a rail fix that a person may paste; it
// ends the fix, so the command runs to the end of the line.
const tryIt = "to try it on this pod: "

// tryARP is the command setting a rail's ARP sysctls in the pod's netns,
// every name in it quoted for the shell.
func tryARP(nsPath, netdev string) string {
	if !pasteable(nsPath, netdev) {
		return notPasteable
	}
	return tryIt + fmt.Sprintf("nsenter --net=%s sysctl -w %s %s", shellWord(nsPath),
		shellWord(sysctlKey(netdev, "arp_ignore")+"=1"), shellWord(sysctlKey(netdev, "arp_announce")+"=2"))
}

// sysctlKey names net.ipv4.conf.<netdev>.<key> for sysctl(8). A netdev
// with a dot in its name (a VLAN, eth0.100) takes the form with slashes,
// which sysctl reads without turning dots into separators.
func sysctlKey(netdev, key string) string {
	if strings.Contains(netdev, ".") {
		return "net/ipv4/conf/" + netdev + "/" + key
	}
	return "net.ipv4.conf." + netdev + "." + key
}

// tryRoute is the command giving a rail a routing table of its own in the
// pod's netns, as sbr does: one nsenter per command, so that no script of
// sh -c has to quote a name a second time.
func tryRoute(nsPath, netdev string, p netip.Prefix, table int) string {
	if !pasteable(nsPath, netdev) {
		return notPasteable
	}
	enter := "nsenter --net=" + shellWord(nsPath)
	return tryIt + fmt.Sprintf("%s ip route add %s dev %s src %s table %d; %s ip rule add from %s table %d",
		enter, p.Masked(), shellWord(netdev), p.Addr(), table, enter, p.Addr(), table)
}

// routeFindings asks the kernel for the route from each of the rail's
// addresses to a peer on that address's subnet; false when one leaves by
// another netdev.
func routeFindings(fs *Findings, n RailNet, rl *Rail, rails []Rail, own map[netip.Addr]bool, nsPath string) bool {
	ok := true
	subj := railSubject(rl)
	for i := range rl.Addresses {
		a := &rl.Addresses[i]
		p, err := netip.ParsePrefix(a.Address)
		if err != nil || !sharedPrefix(p, rl, rails) {
			continue
		}
		peer, found := peerIn(p, own)
		if !found {
			continue
		}
		a.Peer = peer.String()
		dev, err := n.RouteNetdev(p.Addr(), peer)
		if err != nil {
			a.RouteError = err.Error()
			fs.add(Warn, "rail-route", subj, fmt.Sprintf("cannot ask the kernel for the route from %s to %s: %v", p.Addr(), peer, err), "run the doctor as root")
			continue
		}
		a.RouteNetdev = dev
		if dev == rl.Netdev {
			continue
		}
		ok = false
		table := 100 + railIndex(rl, rails)
		fs.add(Fail, "rail-route", subj,
			fmt.Sprintf("traffic from rail %s's address %s leaves by netdev %s, not %s (ip route get %s from %s): what the kernel sends from that address, rdma_cm's address resolution included, goes out of another rail's NIC",
				rl.Device, p.Addr(), dev, rl.Netdev, peer, p.Addr()),
			fmt.Sprintf("chain sbr after each rail's plugins, as %s does: a routing table per rail, chosen by a rule for the rail's address; then recreate the pod; %s",
				RailsNAD, tryRoute(nsPath, rl.Netdev, p, table)))
	}
	return ok
}

func railIndex(rl *Rail, rails []Rail) int {
	for i := range rails {
		if &rails[i] == rl {
			return i
		}
	}
	return 0
}

// sharedPrefix says whether another rail's netdev has an address in p.
func sharedPrefix(p netip.Prefix, rl *Rail, rails []Rail) bool {
	for _, o := range rails {
		if o.Netdev == rl.Netdev {
			continue
		}
		for _, a := range o.Addresses {
			q, err := netip.ParsePrefix(a.Address)
			if err == nil && p.Masked().Overlaps(q.Masked()) {
				return true
			}
		}
	}
	return false
}

// peerIn picks the address a peer on subnet p would have: the highest
// usable one the pod does not own. A /32 has none.
func peerIn(p netip.Prefix, own map[netip.Addr]bool) (netip.Addr, bool) {
	if !p.Addr().Is4() || p.Bits() >= 32 {
		return netip.Addr{}, false
	}
	b := p.Masked().Addr().As4()
	first := binary.BigEndian.Uint32(b[:])
	last := first + uint32(1)<<(32-p.Bits()) - 1
	if p.Bits() < 31 {
		// The network and broadcast addresses are no host's.
		first++
		last--
	}
	for a, tries := last, 0; a >= first && tries < 1024; a, tries = a-1, tries+1 {
		var q [4]byte
		binary.BigEndian.PutUint32(q[:], a)
		if c := netip.AddrFrom4(q); !own[c] {
			return c, true
		}
		if a == first {
			break
		}
	}
	return netip.Addr{}, false
}
