package rdmans

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// Netdev is what the kernel says of a netdev in a pod.
type Netdev struct {
	// ParentBus and Parent name the device behind it
	// (IFLA_PARENT_DEV_BUS_NAME and IFLA_PARENT_DEV_NAME, kernel 5.14
	// on); empty for a virtual netdev such as veth.
	ParentBus, Parent string
	// Alias is its ifalias: host-device keeps the NIC's host name there.
	Alias string
}

// ParentID is the device behind the netdev as NIC.Parent holds it,
// "bus/name"; "" for none.
func (n Netdev) ParentID() string { return parentID(n.ParentBus, n.Parent) }

func parentID(bus, name string) string {
	if name == "" {
		return ""
	}
	return bus + "/" + name
}

// Netdev reads the netdev ifName in the netns at nsPath.
func (Netlink) Netdev(nsPath, ifName string) (n Netdev, err error) {
	err = podns.Do(nsPath, func(podns.Thread) error {
		return withHandle(unix.NETLINK_ROUTE, func(h *netlink.Handle) error {
			link, err := h.LinkByName(ifName)
			if err != nil {
				return fmt.Errorf("failed to find netdev %s in netns %s: %v", ifName, nsPath, err)
			}
			a := link.Attrs()
			n = Netdev{ParentBus: a.ParentDevBus, Parent: a.ParentDev, Alias: a.Alias}
			return nil
		})
	}, podns.CallerThread())
	return n, err
}

// NIC is an attachment's NIC in the pod as its record knows it: what
// RestoreNIC gives back so that host-device's DEL, which takes the link
// called IfName and renames it to its alias, brings the NIC home under
// its own name. The pod can change both the link's name and its alias.
type NIC struct {
	// Parent is the device behind the NIC, "bus/name" (Netdev.ParentID):
	// the kernel's, which no pod can change. "" looks the NIC up by
	// IfName alone (a kernel before 5.14 reports no parent).
	Parent string
	// IfName is CNI_IFNAME, the name host-device looks the link up by.
	IfName string
	// HostName is the NIC's name in the host, which host-device stored
	// in the link's alias at ADD. "" asks RestoreNIC for nothing.
	HostName string
}

// NICFix is what RestoreNIC found and changed. Name and Alias are the
// pod's, to be quoted wherever they are printed.
type NICFix struct {
	// Found is false when the pod has no link that is the NIC.
	Found bool
	// Name is the name the pod had given the NIC, when not IfName.
	Name string
	// Realiased is set when the NIC's alias was not HostName; Alias is
	// what the pod had left there, maybe nothing.
	Realiased bool
	Alias     string
	// Aside is the name the kernel gave the other link that held IfName,
	// moved out of the NIC's way.
	Aside string
}

// LinkID is a link as FindNIC sees it: its name and the device behind it
// ("bus/name", "" for none).
type LinkID struct{ Name, Parent string }

// FindNIC returns the index in links of the NIC nic describes, and of
// another link that holds nic.IfName; -1 for none. The device behind a
// link decides, as the pod names its links and makes virtual ones at
// will; a name alone decides only where no parent is recorded. Of several
// links behind one device (ports of one PCI function) the one called
// IfName is the NIC, and if none is, the NIC cannot be told and none is
// returned: restoring another attachment's link would send that one home
// under this one's name.
func FindNIC(links []LinkID, nic NIC) (own, holder int) {
	named := -1
	var behind []int
	for i, l := range links {
		if l.Name == nic.IfName {
			named = i
		}
		if nic.Parent != "" && l.Parent == nic.Parent {
			behind = append(behind, i)
		}
	}
	switch {
	case nic.Parent == "":
		return named, -1
	case len(behind) == 1:
		own = behind[0]
	case named >= 0 && slices.Contains(behind, named):
		own = named
	default:
		return -1, -1
	}
	if named >= 0 && named != own {
		return own, named
	}
	return own, -1
}

// asidePattern names a link moved out of the NIC's way; the kernel puts
// the lowest free number in place of %d.
const asidePattern = "rn-aside%d"

// RestoreNIC readies the pod's NIC in the netns at nsPath for
// host-device's DEL: it finds the NIC (FindNIC), moves any other link
// called nic.IfName aside, renames the NIC back to nic.IfName, down, when
// the pod renamed it, and sets its alias to nic.HostName. A NIC not in
// the pod is no error (Found false). Release does the same in its visit
// to the pod.
func (Netlink) RestoreNIC(nsPath string, nic NIC) (fix NICFix, err error) {
	err = podns.Do(nsPath, func(podns.Thread) error {
		fix, err = restoreNIC(nic)
		return err
	}, podns.CallerThread())
	return fix, err
}

// restoreNIC is RestoreNIC in the calling thread's netns.
func restoreNIC(nic NIC) (fix NICFix, err error) {
	err = withHandle(unix.NETLINK_ROUTE, func(h *netlink.Handle) error {
		links, err := linkList(h)
		if err != nil {
			return fmt.Errorf("cannot list the links: %v", err)
		}
		ids := make([]LinkID, len(links))
		for i, l := range links {
			a := l.Attrs()
			ids[i] = LinkID{Name: a.Name, Parent: parentID(a.ParentDevBus, a.ParentDev)}
		}
		own, holder := FindNIC(ids, nic)
		if own < 0 {
			return nil
		}
		var other netlink.Link
		if holder >= 0 {
			other = links[holder]
		}
		fix, err = fixNIC(h, links[own], other, nic)
		return err
	})
	return fix, err
}

// fixNIC gives the NIC its name and alias back, moving holder, another
// link called nic.IfName, out of its way first.
func fixNIC(h *netlink.Handle, own, holder netlink.Link, nic NIC) (NICFix, error) {
	fix := NICFix{Found: true}
	if name := own.Attrs().Name; name != nic.IfName {
		if holder != nil {
			aside, err := setAside(h, holder)
			if err != nil {
				return fix, fmt.Errorf("cannot rename the pod's link %s, which is not the NIC, out of the way: %v", nic.IfName, err)
			}
			fix.Aside = aside
		}
		if err := renameDown(h, own, nic.IfName); err != nil {
			return fix, fmt.Errorf("cannot rename the NIC, called %q in the pod, back to %s: %v", name, nic.IfName, err)
		}
		fix.Name = name
	}
	if alias := own.Attrs().Alias; alias != nic.HostName {
		if err := h.LinkSetAlias(own, nic.HostName); err != nil {
			return fix, fmt.Errorf("cannot set the alias of %s back to %s: %v", nic.IfName, nic.HostName, err)
		}
		fix.Realiased, fix.Alias = true, alias
	}
	return fix, nil
}

// renameDown renames a link, down: the kernel refuses to rename most links
// that are up (EBUSY), and host-device's move out of the pod takes the
// link down anyway.
func renameDown(h *netlink.Handle, l netlink.Link, name string) error {
	if l.Attrs().Flags&net.FlagUp != 0 {
		if err := h.LinkSetDown(l); err != nil {
			return err
		}
	}
	return h.LinkSetName(l, name)
}

// setAside renames l to the first free name of asidePattern and returns it.
func setAside(h *netlink.Handle, l netlink.Link) (string, error) {
	if err := renameDown(h, l, asidePattern); err != nil {
		return "", err
	}
	moved, err := h.LinkByIndex(l.Attrs().Index)
	if err != nil {
		return "", err
	}
	return moved.Attrs().Name, nil
}

// linkList lists the links of the handle's netns, retrying dumps the
// kernel marked as interrupted.
func linkList(h *netlink.Handle) ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := h.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 5 {
			runtime.Gosched()
			continue
		}
		return links, err
	}
}
