package plugin

import (
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/linkconf"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Links reads and sets the IP configuration of a claimed NIC's netdev: in
// the host before it leaves and after it comes home, in the pod after
// host-device moved it in. The unit tests fake it.
type Links interface {
	// HostNetdev names the host's netdev of PCI function pci; an error
	// when the host has none.
	HostNetdev(pci string) (string, error)
	Read(ifName string) (linkconf.Config, error)
	ApplyPod(nsPath, ifName string, p linkconf.Pod) error
	// Rename renames a host link (one that came home under its pod-side
	// name, when its pod's netns was destroyed).
	Rename(from, to string) error
	Restore(ifName string, c linkconf.Config) error
}

// hostLinks is the running kernel.
type hostLinks struct{}

func (hostLinks) HostNetdev(pci string) (string, error) {
	return linkconf.NetdevOfPCI("/sys/bus/pci/devices", pci)
}
func (hostLinks) Read(ifName string) (linkconf.Config, error) { return linkconf.Read(ifName) }
func (hostLinks) ApplyPod(nsPath, ifName string, p linkconf.Pod) error {
	return linkconf.ApplyPod(nsPath, ifName, p)
}
func (hostLinks) Rename(from, to string) error { return linkconf.Rename(from, to) }
func (hostLinks) Restore(ifName string, c linkconf.Config) error {
	return linkconf.Restore(ifName, c)
}

func (p *Plugin) links() Links {
	if p.Links != nil {
		return p.Links
	}
	return hostLinks{}
}

// readHostLink is the host's name and IP configuration of dev's netdev
// when its claim asks for the NIC's host addresses ("" and nil
// otherwise), read before host-device moves the NIC: the move drops it.
func (c *call) readHostLink(dev drarecord.Device) (string, *linkconf.Config, error) {
	if dev.Config == nil || dev.Config.Addresses != drarecord.AddressesHost {
		return "", nil, nil
	}
	name, err := c.p.links().HostNetdev(dev.PCIAddress)
	if err != nil {
		return "", nil, fmt.Errorf("the claim asks for NIC %s's host addresses, but: %v; nothing was changed", dev.PCIAddress, err)
	}
	hc, err := c.p.links().Read(name)
	if err != nil {
		return "", nil, fmt.Errorf("the claim asks for NIC %s's host addresses, but: %v; nothing was changed", dev.PCIAddress, err)
	}
	c.log.Infof("NIC %s (%s in the host): carrying %d address(es) and %d route(s) into the pod", dev.PCIAddress, name, len(hc.Addrs), len(hc.Routes))
	return name, &hc, nil
}

// withHostAddrs adds the host addresses that the pod's NIC ifName now
// carries to host-device's result, which has none (host-device ran
// without IPAM): the result is where the runtime and Multus (its
// network-status) read a pod's addresses.
func withHostAddrs(res types.Result, ifName string, addrs []linkconf.Addr) (types.Result, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("cannot read host-device's result: %v", err)
	}
	i := slices.IndexFunc(r.Interfaces, func(in *current.Interface) bool { return in.Name == ifName && in.Sandbox != "" })
	if i < 0 {
		return nil, fmt.Errorf("host-device's result has no interface %s in the pod", ifName)
	}
	for _, a := range addrs {
		ip, n, err := net.ParseCIDR(a.CIDR)
		if err != nil {
			return nil, fmt.Errorf("host address %q of %s: %v", a.CIDR, ifName, err)
		}
		n.IP = ip
		r.IPs = append(r.IPs, &current.IPConfig{Interface: current.Int(i), Address: *n})
	}
	return r, nil
}

// podLinkOf is what the claim's configuration makes of the NIC in the
// pod beyond host-device's move: nil when nothing.
func podLinkOf(dev drarecord.Device, host *linkconf.Config) *linkconf.Pod {
	p := linkconf.Pod{Host: host}
	if cfg := dev.Config; cfg != nil {
		if cfg.MTU != nil {
			p.MTU = *cfg.MTU
		}
		if a := cfg.ARP; a != nil {
			p.ARP = &linkconf.ARP{Ignore: a.Ignore, Announce: a.Announce}
		}
	}
	if p.Host == nil && p.MTU == 0 && p.ARP == nil {
		return nil
	}
	return &p
}

// homeWait bounds how long DEL waits for a NIC that its destroyed pod
// netns gives back to the host (the kernel does it asynchronously).
const homeWait = 3 * time.Second

// restoreHostLink gives the NIC of rec, home again, what the host had
// before the pod: its name, when it came home under its pod-side name,
// and its IP configuration. A NIC that is not back in the host is
// waited for a little, then left with an error for DEL's retry.
func (c *call) restoreHostLink(pci, hostName string, hc *linkconf.Config) error {
	if hc == nil || pci == "" {
		return nil
	}
	links := c.p.links()
	name, err := links.HostNetdev(pci)
	for deadline := time.Now().Add(homeWait); err != nil && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		name, err = links.HostNetdev(pci)
	}
	if err != nil {
		return fmt.Errorf("NIC %s is not back in the host, so its host addresses cannot be given back: %v; retry DEL", pci, err)
	}
	if hostName != "" && name != hostName {
		if err := links.Rename(name, hostName); err != nil {
			return fmt.Errorf("NIC %s came home as %s and cannot get its host name %s back: %v; retry DEL", pci, name, hostName, err)
		}
		c.log.Infof("NIC %s came home as %s: renamed it back to %s", pci, name, hostName)
		name = hostName
	}
	if err := links.Restore(name, *hc); err != nil {
		return fmt.Errorf("NIC %s (%s) is home, but: %v; retry DEL", pci, name, err)
	}
	c.log.Infof("NIC %s (%s): gave the host back its %d address(es) and %d route(s)", pci, name, len(hc.Addrs), len(hc.Routes))
	return nil
}

// restoreRecorded is restoreHostLink for what rec remembers.
func (c *call) restoreRecorded(rec *state.Record) error {
	if rec == nil {
		return nil
	}
	return c.restoreHostLink(rec.PCIAddress, rec.HostNetdev, rec.HostLink)
}
