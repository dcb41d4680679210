package plugin

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// target is the RDMA device chosen for this attachment and why.
type target struct {
	rdmadev.Device
	Rule string
}

// resolve picks the RDMA device to move. First match wins: a device the
// operator named, a device ID from Multus or a device plugin, then the
// device tree around the pod's netdev.
func (c *call) resolve(recs []*state.Record) (target, error) {
	if src := c.conf.ExplicitDevice(); src.Value != "" {
		return c.byName(recs, src.Value, src.From)
	}
	if src := c.conf.DeviceIDSource(); src.Value != "" {
		path, err := c.p.Sysfs.PathForDeviceID(src.Value)
		if err != nil {
			return target{}, fmt.Errorf("%s %q: %v", src.From, src.Value, err)
		}
		return c.nearest(recs, fmt.Sprintf("%s %s", src.From, src.Value), path)
	}
	ifName, err := podNetdev(c.conf.Result, c.args.IfName)
	if err != nil {
		return target{}, err
	}
	bus, parent, err := c.p.Kernel.NetdevParent(c.args.Netns, ifName)
	if err != nil {
		return target{}, err
	}
	if parent == "" {
		return target{}, fmt.Errorf("netdev %s in the pod has no parent device (a virtual interface such as veth?), so no RDMA device belongs to it; chain rdma-netns after a plugin that moves a physical NIC or VF (host-device, sriov), or name the device with rdmaDevice", ifName)
	}
	path, err := c.p.Sysfs.BusDevicePath(bus, parent)
	if err != nil {
		return target{}, fmt.Errorf("netdev %s: cannot find its parent device %s/%s in sysfs: %v", ifName, bus, parent, err)
	}
	return c.nearest(recs, fmt.Sprintf("netdev %s (parent %s/%s)", ifName, bus, parent), path)
}

func (c *call) byName(recs []*state.Record, name, from string) (target, error) {
	devs, err := c.hostDevices()
	if err != nil {
		return target{}, err
	}
	for _, d := range devs {
		if d.Name == name {
			return c.found(target{d, from}), nil
		}
	}
	// Not visible in the host: say who has it when we know.
	if owner := liveClaim(recs, c.key(), name); owner != nil {
		return target{}, fmt.Errorf("RDMA device %s (from %s) is held by %s; nothing was changed. %s", name, from, holder(owner), freeIt)
	}
	in, err := c.p.Kernel.InHost(name)
	if err != nil {
		return target{}, err
	}
	if in {
		// Netlink sees it although sysfs does not list it: move it anyway,
		// without a PCI address for the device-info file.
		return c.found(target{rdmadev.Device{Name: name}, from}), nil
	}
	return target{}, fmt.Errorf("RDMA device %s (from %s) is not in the host network namespace: it does not exist or another netns holds it; the host has %s", name, from, names(devs))
}

// nearest picks the host RDMA device closest to the device at path.
func (c *call) nearest(recs []*state.Record, what, path string) (target, error) {
	// The usual case, one device right under the parent, is answered by
	// one directory read instead of a look at every RDMA device on the node.
	if m, ok := c.p.Sysfs.Direct(path); ok {
		return c.found(target{m.Device, fmt.Sprintf("%s: %s", what, m.Relation)}), nil
	}
	fallback := c.p.Sysfs.FallbackFunction(path)
	// Next, the parents' paths alone decide, with the one device chosen
	// checked; anything less clear-cut takes the full look below.
	if cands, exact, err := c.p.Sysfs.Candidates(); err == nil && exact {
		if matches := rdmadev.Closest(path, fallback, cands); len(matches) == 1 {
			if d, ok := c.p.Sysfs.Complete(matches[0].Device); ok {
				return c.found(target{d, fmt.Sprintf("%s: %s", what, matches[0].Relation)}), nil
			}
		}
	}
	devs, err := c.hostDevices()
	if err != nil {
		return target{}, err
	}
	matches := rdmadev.Closest(path, fallback, devs)
	switch len(matches) {
	case 1:
		m := matches[0]
		return c.found(target{m.Device, fmt.Sprintf("%s: %s", what, m.Relation)}), nil
	case 0:
		if owner := ownerOf(recs, c.key(), path, c.p.Sysfs.PCIAddressOf(path)); owner != nil {
			return target{}, fmt.Errorf("the RDMA device of %s (%s) is held by %s; nothing was changed. %s", what, owner.Device, holder(owner), freeIt)
		}
		return target{}, rdmadev.NoMatch(what, path, devs)
	default:
		return target{}, rdmadev.Ambiguous(what, matches)
	}
}

func (c *call) found(t target) target {
	c.log.Infof("resolved RDMA device %s by %s", t.Name, t.Rule)
	return t
}

// ownerOf finds the live record of another attachment whose device sat
// where this one would: its device has left the host, so sysfs no longer
// shows it.
func ownerOf(recs []*state.Record, self state.Key, path, pci string) *state.Record {
	for _, r := range recs {
		if r.Key == self || !sameNetns(r) {
			continue
		}
		if r.DevPath != "" && (r.DevPath == path || (pci != "" && r.PCIAddress == pci && strings.HasPrefix(path, r.DevPath+"/"))) {
			return r
		}
	}
	return nil
}

// podNetdev picks the pod's netdev from prevResult: the interface in the
// sandbox named CNI_IFNAME, else the only one in a sandbox. Plugins that
// report no interfaces leave CNI_IFNAME.
func podNetdev(res *current.Result, ifName string) (string, error) {
	var inPod []string
	for _, iface := range res.Interfaces {
		if iface == nil || iface.Sandbox == "" {
			continue
		}
		if iface.Name == ifName {
			return ifName, nil
		}
		inPod = append(inPod, iface.Name)
	}
	switch len(inPod) {
	case 0:
		return ifName, nil
	case 1:
		return inPod[0], nil
	}
	return "", errors.New("prevResult lists several interfaces in the pod (" + strings.Join(inPod, ", ") + ") and none is CNI_IFNAME " + ifName + "; set rdmaDevice or deviceID to say which RDMA device to move")
}

func names(devs []rdmadev.Device) string {
	if len(devs) == 0 {
		return "no RDMA devices"
	}
	var ns []string
	for _, d := range devs {
		ns = append(ns, d.Name)
	}
	sort.Strings(ns)
	return strings.Join(ns, ", ")
}
