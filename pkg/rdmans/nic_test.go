package rdmans

import (
	"fmt"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

func TestFindNIC(t *testing.T) {
	const nicParent = "pci/0000:3b:00.0"
	links := func(l ...LinkID) []LinkID { return l }
	nic := NIC{Parent: nicParent, IfName: "net1", HostName: "ens1f0np0"}
	tests := []struct {
		name        string
		links       []LinkID
		nic         NIC
		own, holder int
	}{
		{"as left", links(LinkID{"lo", ""}, LinkID{"net1", nicParent}), nic, 1, -1},
		{"renamed", links(LinkID{"lo", ""}, LinkID{"x", nicParent}), nic, 1, -1},
		{"renamed, a dummy in its place", links(LinkID{"net1", ""}, LinkID{"x", nicParent}), nic, 1, 0},
		{"renamed, another NIC in its place", links(LinkID{"net1", "pci/0000:3b:00.1"}, LinkID{"net2", nicParent}), nic, 1, 0},
		{"gone, a dummy in its place", links(LinkID{"net1", ""}), nic, -1, -1},
		{"gone", links(LinkID{"lo", ""}), nic, -1, -1},
		{"two ports of one function, by name", links(LinkID{"net2", nicParent}, LinkID{"net1", nicParent}), nic, 1, -1},
		{"two ports of one function, both renamed", links(LinkID{"a", nicParent}, LinkID{"b", nicParent}), nic, -1, -1},
		{"no parent recorded: by name", links(LinkID{"x", nicParent}, LinkID{"net1", ""}), NIC{IfName: "net1", HostName: "eth1"}, 1, -1},
		{"no parent recorded, no such name", links(LinkID{"x", nicParent}), NIC{IfName: "net1", HostName: "eth1"}, -1, -1},
	}
	for _, tt := range tests {
		own, holder := FindNIC(tt.links, tt.nic)
		if own != tt.own || holder != tt.holder {
			t.Errorf("%s: FindNIC = %d, %d; want %d, %d", tt.name, own, holder, tt.own, tt.holder)
		}
	}
}

// newVeth makes a veth pair, name and peer, in the netns at nsPath, up,
// name with alias. (Test kernels may lack dummy links; none has a parent
// device either way.)
func newVeth(t *testing.T, nsPath, name, peer, alias string) {
	t.Helper()
	err := podns.Do(nsPath, func(podns.Thread) error {
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
		if err := netlink.LinkAdd(l); err != nil {
			return err
		}
		if err := netlink.LinkSetAlias(l, alias); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("cannot make veth %s in %s: %v", name, nsPath, err)
	}
}

// linkIn describes the link called name in the netns at nsPath:
// "[alias] up=...", "" if there is none.
func linkIn(t *testing.T, nsPath, name string) string {
	t.Helper()
	var desc string
	err := podns.Do(nsPath, func(podns.Thread) error {
		l, err := netlink.LinkByName(name)
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil
		}
		if err != nil {
			return err
		}
		desc = fmt.Sprintf("[%s] up=%v", l.Attrs().Alias, l.Attrs().Flags&unix.IFF_UP != 0)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return desc
}

// A link whose alias the pod changed gets the host name back; a second
// visit finds nothing to change; a link not in the pod is no error.
// Veth links have no parent device, so the lookup is by name here (what
// a kernel before 5.14 leaves); TestFindNIC covers the parent.
func TestRestoreNICAlias(t *testing.T) {
	p := newPodNS(t)
	name := fmt.Sprintf("rnd%x", os.Getpid()%0xfffff)
	newVeth(t, p.ns.Path(), name, name+"p", "eth2\x1b[2J")
	nic := NIC{IfName: name, HostName: "eth1"}
	fix, err := Netlink{}.RestoreNIC(p.ns.Path(), nic)
	if err != nil {
		t.Fatal(err)
	}
	if want := (NICFix{Found: true, Realiased: true, Alias: "eth2\x1b[2J"}); fix != want {
		t.Fatalf("RestoreNIC = %+v, want %+v", fix, want)
	}
	if got := linkIn(t, p.ns.Path(), name); got != "[eth1] up=true" {
		t.Fatalf("%s: %s after RestoreNIC, want alias eth1, still up", name, got)
	}
	if fix, err := (Netlink{}).RestoreNIC(p.ns.Path(), nic); err != nil || fix != (NICFix{Found: true}) {
		t.Fatalf("second RestoreNIC = %+v, %v; want found, nothing changed", fix, err)
	}
	if fix, err := (Netlink{}).RestoreNIC(p.ns.Path(), NIC{IfName: "nosuchif0", HostName: "eth1"}); err != nil || fix.Found {
		t.Fatalf("RestoreNIC of a link not in the pod = %+v, %v; want not found, no error", fix, err)
	}
}

// A NIC the pod renamed goes back to CNI_IFNAME, down, after the link the
// pod put under that name is renamed aside by the kernel.
func TestFixNICRenamesBack(t *testing.T) {
	p := newPodNS(t)
	suffix := fmt.Sprintf("%x", os.Getpid()%0xfffff)
	ifName, renamed := "rni"+suffix, "rnr"+suffix
	newVeth(t, p.ns.Path(), renamed, renamed+"p", "eth2")
	newVeth(t, p.ns.Path(), ifName, ifName+"p", "eth2")
	var fix NICFix
	err := podns.Do(p.ns.Path(), func(podns.Thread) error {
		return withHandle(unix.NETLINK_ROUTE, func(h *netlink.Handle) error {
			own, err := h.LinkByName(renamed)
			if err != nil {
				return err
			}
			holder, err := h.LinkByName(ifName)
			if err != nil {
				return err
			}
			fix, err = fixNIC(h, own, holder, NIC{IfName: ifName, HostName: "eth1"})
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := (NICFix{Found: true, Name: renamed, Realiased: true, Alias: "eth2", Aside: "rn-aside0"}); fix != want {
		t.Fatalf("fixNIC = %+v, want %+v", fix, want)
	}
	for name, want := range map[string]string{ifName: "[eth1] up=false", "rn-aside0": "[eth2] up=false", renamed: ""} {
		if got := linkIn(t, p.ns.Path(), name); got != want {
			t.Errorf("link %s after fixNIC: %q, want %q", name, got, want)
		}
	}
}
