// Package linkconf carries a NIC's IP configuration (its addresses, its
// routes, its MTU, whether it is up) from the host into a pod and back.
//
// A rail fabric gives each NIC of a node its own address and routes, set
// on the host by the node's network configuration. Moving a netdev to
// another network namespace drops all of them (the kernel flushes a
// link's addresses and routes as it leaves a netns), and host-device
// neither carries them in nor puts them back: a claim that asks for the
// NIC's host addresses gets them here, read before the move, applied in
// the pod after it, and given back to the host when the NIC comes home.
package linkconf

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// Config is a link's IP configuration as the host had it.
type Config struct {
	Up     bool    `json:"up"`
	MTU    int     `json:"mtu"`
	Addrs  []Addr  `json:"addrs,omitempty"`
	Routes []Route `json:"routes,omitempty"`
}

// Addr is one address with its prefix ("10.100.40.5/24").
type Addr struct {
	CIDR string `json:"cidr"`
	// Flags are the address's IFA_F_* flags that say how the kernel
	// treats it (noprefixroute, ...), as set.
	Flags int `json:"flags,omitempty"`
}

// Route is one route through the link. Table 0 or 254 is the main table;
// routes of other tables (a rail's source-routing table) are given back
// to the host but not carried into the pod, which has no rule to use
// them.
type Route struct {
	Dst      string `json:"dst"` // CIDR; "" for a default route
	Gw       string `json:"gw,omitempty"`
	Src      string `json:"src,omitempty"`
	Metric   int    `json:"metric,omitempty"`
	Table    int    `json:"table,omitempty"`
	Scope    int    `json:"scope,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
	Onlink   bool   `json:"onlink,omitempty"`
}

// ARP is what a pod with several NICs on one subnet sets on each.
type ARP struct {
	Ignore   *int
	Announce *int
}

// keptFlags are the address flags Read keeps: how the kernel treats the
// address, not its state (tentative, deprecated).
const keptFlags = unix.IFA_F_NOPREFIXROUTE | unix.IFA_F_HOMEADDRESS | unix.IFA_F_MANAGETEMPADDR

// NetdevOfPCI names the host's netdev of the PCI function pci, as
// host-device finds it: in the function's net directory, or its virtio
// device's. sysBusPCI is /sys/bus/pci/devices (tests give another).
func NetdevOfPCI(sysBusPCI, pci string) (string, error) {
	for _, pattern := range []string{filepath.Join(sysBusPCI, pci, "net", "*"), filepath.Join(sysBusPCI, pci, "virtio*", "net", "*")} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return "", err
		}
		if len(m) == 1 {
			return filepath.Base(m[0]), nil
		}
		if len(m) > 1 {
			return "", fmt.Errorf("PCI function %s has %d netdevs in the host", pci, len(m))
		}
	}
	return "", fmt.Errorf("PCI function %s has no netdev in the host (already in a pod, or no network driver bound)", pci)
}

// Read reads the IP configuration of the host's link ifName: its
// permanent addresses but IPv6 link-local ones (the kernel makes those),
// and its routes but the kernel's own (prefix and local routes, which
// come back with the addresses).
func Read(ifName string) (Config, error) {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return Config{}, fmt.Errorf("reading netdev %s: %v", ifName, err)
	}
	a := link.Attrs()
	c := Config{Up: a.Flags&net.FlagUp != 0, MTU: a.MTU}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return Config{}, fmt.Errorf("reading the addresses of %s: %v", ifName, err)
	}
	for _, ad := range addrs {
		if ad.IP.IsLinkLocalUnicast() || (ad.IP.To4() == nil && ad.Flags&unix.IFA_F_PERMANENT == 0) {
			continue
		}
		c.Addrs = append(c.Addrs, Addr{CIDR: ad.IPNet.String(), Flags: ad.Flags & keptFlags})
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return Config{}, fmt.Errorf("reading the routes of %s: %v", ifName, err)
	}
	for _, r := range routes {
		if r.Table == unix.RT_TABLE_LOCAL || r.Protocol == unix.RTPROT_KERNEL || r.Type != unix.RTN_UNICAST || len(r.MultiPath) > 0 {
			continue
		}
		if r.Dst != nil && (r.Dst.IP.IsLinkLocalUnicast() || r.Dst.IP.IsMulticast()) {
			continue
		}
		c.Routes = append(c.Routes, fromRoute(r))
	}
	return c, nil
}

func fromRoute(r netlink.Route) Route {
	out := Route{Metric: r.Priority, Table: r.Table, Scope: int(r.Scope), Protocol: int(r.Protocol), Onlink: r.Flags&unix.RTNH_F_ONLINK != 0}
	if r.Dst != nil && !isDefault(r.Dst) {
		out.Dst = r.Dst.String()
	}
	if r.Gw != nil {
		out.Gw = r.Gw.String()
	}
	if r.Src != nil {
		out.Src = r.Src.String()
	}
	return out
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}

// toRoute is r on the link with index idx; table overrides r's when not
// 0 (the pod's routes all go to its main table).
func (r Route) toRoute(idx, table int) (*netlink.Route, error) {
	nr := &netlink.Route{LinkIndex: idx, Priority: r.Metric, Table: r.Table, Scope: netlink.Scope(r.Scope), Protocol: netlink.RouteProtocol(r.Protocol)}
	if table != 0 {
		nr.Table = table
	}
	if r.Onlink {
		nr.Flags |= unix.RTNH_F_ONLINK
	}
	if r.Gw != "" {
		if nr.Gw = net.ParseIP(r.Gw); nr.Gw == nil {
			return nil, fmt.Errorf("route gateway %q is not an address", r.Gw)
		}
	}
	if r.Src != "" {
		if nr.Src = net.ParseIP(r.Src); nr.Src == nil {
			return nil, fmt.Errorf("route source %q is not an address", r.Src)
		}
	}
	if r.Dst != "" {
		_, dst, err := net.ParseCIDR(r.Dst)
		if err != nil {
			return nil, fmt.Errorf("route destination %q: %v", r.Dst, err)
		}
		nr.Dst = dst
	} else if r.Gw != "" && nr.Gw.To4() == nil {
		nr.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	} else {
		nr.Dst = &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	}
	return nr, nil
}

// apply gives link the addresses and routes of c (only the main table's
// when mainOnly), direct routes before those through a gateway, which
// need them. An address or route already there is no error: Restore
// runs again when DEL is retried.
func apply(h *netlink.Handle, link netlink.Link, c Config, mainOnly, nodad bool) error {
	for _, a := range c.Addrs {
		ad, err := netlink.ParseAddr(a.CIDR)
		if err != nil {
			return fmt.Errorf("address %q: %v", a.CIDR, err)
		}
		ad.Flags = a.Flags
		if nodad && ad.IP.To4() == nil {
			// The host had the address; checking it again only delays it.
			ad.Flags |= unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, ad); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding address %s to %s: %v", a.CIDR, link.Attrs().Name, err)
		}
	}
	routes := slices.Clone(c.Routes)
	sort.SliceStable(routes, func(i, j int) bool { return routes[i].Gw == "" && routes[j].Gw != "" })
	for _, r := range routes {
		table := 0
		if mainOnly {
			if r.Table != 0 && r.Table != unix.RT_TABLE_MAIN {
				continue
			}
			table = unix.RT_TABLE_MAIN
		}
		nr, err := r.toRoute(link.Attrs().Index, table)
		if err != nil {
			return err
		}
		if err := h.RouteAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding route %s to %s: %v", describe(r), link.Attrs().Name, err)
		}
	}
	return nil
}

func describe(r Route) string {
	s := r.Dst
	if s == "" {
		s = "default"
	}
	if r.Gw != "" {
		s += " via " + r.Gw
	}
	if r.Table != 0 && r.Table != unix.RT_TABLE_MAIN {
		s += " table " + strconv.Itoa(r.Table)
	}
	return s
}

// Pod is what a pod's NIC gets: the host's addresses and main-table
// routes (nil Host for none), an MTU (0 keeps it) and ARP settings.
type Pod struct {
	Host *Config
	MTU  int
	ARP  *ARP
}

// ApplyPod sets up ifName in the netns at nsPath as p says. The link is
// up already (host-device set it up).
func ApplyPod(nsPath, ifName string, p Pod) error {
	return podns.Do(nsPath, func(podns.Thread) error {
		return withLink(ifName, "the pod", p.MTU, func(h *netlink.Handle, link netlink.Link) error {
			return applyPod(h, link, p)
		})
	})
}

// applyPod is ApplyPod on the pod's link, its MTU set.
func applyPod(h *netlink.Handle, link netlink.Link, p Pod) error {
	ifName := link.Attrs().Name
	if p.ARP != nil {
		// Per-netns sysctls: the thread is in the pod's netns, so
		// /proc/sys/net is the pod's.
		for key, v := range map[string]*int{"arp_ignore": p.ARP.Ignore, "arp_announce": p.ARP.Announce} {
			if v == nil {
				continue
			}
			path := filepath.Join("/proc/sys/net/ipv4/conf", ifName, key)
			if err := os.WriteFile(path, []byte(strconv.Itoa(*v)), 0o644); err != nil {
				return fmt.Errorf("setting %s of %s in the pod to %d: %v", key, ifName, *v, err)
			}
		}
	}
	if p.Host == nil {
		return nil
	}
	return apply(h, link, *p.Host, true, true)
}

// withLink runs fn on the link ifName of the calling thread's netns
// (where, for errors), its MTU set to mtu first (0 keeps it).
func withLink(ifName, where string, mtu int, fn func(*netlink.Handle, netlink.Link) error) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("finding %s in %s: %v", ifName, where, err)
	}
	if mtu != 0 && link.Attrs().MTU != mtu {
		if err := h.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("setting the MTU of %s in %s to %d: %v", ifName, where, mtu, err)
		}
	}
	return fn(h, link)
}

// Restore gives the host's link ifName back c: its MTU, its up state,
// its addresses and routes (routes through a down link cannot be added,
// and the kernel removes them when a link goes down, so a link that was
// down gets none).
func Restore(ifName string, c Config) error {
	return withLink(ifName, "the host", c.MTU, func(h *netlink.Handle, link netlink.Link) error {
		return restore(h, link, c)
	})
}

func restore(h *netlink.Handle, link netlink.Link, c Config) error {
	ifName := link.Attrs().Name
	if c.Up {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("setting %s up again: %v", ifName, err)
		}
	} else {
		c.Routes = nil
	}
	return apply(h, link, c, false, false)
}

// Rename renames the host's link from to to; a link must be down to be
// renamed, and one back from a destroyed netns is.
func Rename(from, to string) error {
	link, err := netlink.LinkByName(from)
	if err != nil {
		return err
	}
	return netlink.LinkSetName(link, to)
}
