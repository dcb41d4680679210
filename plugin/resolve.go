package plugin

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// target is the RDMA device chosen for this attachment and why.
type target struct {
	rdmadev.Device
	Rule string
}

// refusal is an ADD refused for what the pod asked for itself. It is the
// pod's own doing, so ADD reports it as it is instead of looking for a
// device already in the pod to adopt.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

// refuse says which per-pod input was refused, its value and the rule.
func refuse(s config.Source, why string) error {
	return &refusal{fmt.Sprintf("%s %q refused: %s; a pod may narrow what its network allows, never widen it; nothing was changed", s.From, s.Value, why)}
}

// resolve picks the RDMA device to move: the one the network gives this
// attachment, which what the pod asked for may narrow, never widen. Only a
// network that lists allowedPodDevices lets the pod pick among them.
func (c *call) resolve(recs []*state.Record, req config.PodRequest) (target, error) {
	if len(c.conf.AllowedPodDevices) > 0 && len(req.Devices)+len(req.DeviceIDs) > 0 {
		return c.podChoice(recs, req)
	}
	if len(req.DeviceIDs) > 0 && !c.pinned() {
		// host-device takes the pod's deviceID over its own device when it
		// declares the capability, and the device of "the pod's netdev" is
		// then the pod's pick: only allowedPodDevices may bound it.
		return target{}, refuse(req.DeviceIDs[0], "this network lists no allowedPodDevices, and a pod's deviceID may have chosen the NIC itself (host-device takes it when it declares the deviceID capability)")
	}
	t, err := c.granted(recs)
	if err != nil {
		return target{}, err
	}
	why := fmt.Sprintf("this network gives the attachment RDMA device %s (%s) and lists no allowedPodDevices", t.Name, t.Rule)
	for _, s := range req.Devices {
		if s.Value != t.Name {
			return target{}, refuse(s, why)
		}
	}
	for _, s := range req.DeviceIDs {
		if !c.idNames(s.Value, t) {
			return target{}, refuse(s, why)
		}
	}
	return t, nil
}

// pinned reports whether the network's configuration names its device
// (rdmaDevice, deviceID, pciBusID), rather than following the pod's netdev.
func (c *call) pinned() bool {
	return c.conf.NetworkDevice().Value != "" || c.conf.NetworkDeviceID().Value != ""
}

// granted is the device the network gives the attachment: the one its
// configuration names, then the one of a device ID it holds (the
// operator's, or a device plugin's allocation), then the one in the device
// tree around the pod's netdev.
func (c *call) granted(recs []*state.Record) (target, error) {
	if src := c.conf.NetworkDevice(); src.Value != "" {
		return c.byName(recs, src.Value, src.From)
	}
	if src := c.conf.NetworkDeviceID(); src.Value != "" {
		return c.byDeviceID(recs, src)
	}
	ifName, err := podNetdev(c.conf.Result, c.args.IfName)
	if err != nil {
		return target{}, err
	}
	nd, err := c.netdev(ifName)
	if err != nil {
		return target{}, err
	}
	bus, parent := nd.ParentBus, nd.Parent
	if parent == "" {
		return target{}, fmt.Errorf("netdev %s in the pod has no parent device (a virtual interface such as veth?), so no RDMA device belongs to it; chain rdma-netns after a plugin that moves a physical NIC or VF (host-device, sriov), or name the device with rdmaDevice", ifName)
	}
	path, err := c.p.Sysfs.BusDevicePath(bus, parent)
	if err != nil {
		return target{}, fmt.Errorf("netdev %s: cannot find its parent device %s/%s in sysfs: %v", ifName, bus, parent, err)
	}
	return c.nearest(recs, fmt.Sprintf("netdev %s (parent %s/%s)", ifName, bus, parent), path)
}

func (c *call) byDeviceID(recs []*state.Record, src config.Source) (target, error) {
	path, err := c.p.Sysfs.PathForDeviceID(src.Value)
	if err != nil {
		return target{}, fmt.Errorf("%s %q: %v", src.From, src.Value, err)
	}
	return c.nearest(recs, fmt.Sprintf("%s %s", src.From, src.Value), path)
}

// podChoice is the device the pod picked from the network's
// allowedPodDevices. Several per-pod inputs must agree on one device.
func (c *call) podChoice(recs []*state.Record, req config.PodRequest) (target, error) {
	allowed := fmt.Sprintf("this network's allowedPodDevices are %s", strings.Join(c.conf.AllowedPodDevices, ", "))
	var chosen *target
	pick := func(s config.Source, t target) error {
		if !slices.Contains(c.conf.AllowedPodDevices, t.Name) {
			return refuse(s, fmt.Sprintf("it names RDMA device %s and %s", t.Name, allowed))
		}
		if chosen != nil && chosen.Name != t.Name {
			return refuse(s, fmt.Sprintf("another setting of the pod names RDMA device %s", chosen.Name))
		}
		chosen = &t
		return nil
	}
	for _, s := range req.Devices {
		// Checked before the look-up: what a pod may not pick, it learns
		// nothing about.
		if !slices.Contains(c.conf.AllowedPodDevices, s.Value) {
			return target{}, refuse(s, allowed)
		}
		t, err := c.byName(recs, s.Value, s.From)
		if err != nil {
			return target{}, err
		}
		if err := pick(s, t); err != nil {
			return target{}, err
		}
	}
	for _, s := range req.DeviceIDs {
		t, err := c.podDeviceID(recs, s, allowed)
		if err != nil {
			return target{}, err
		}
		if err := pick(s, t); err != nil {
			return target{}, err
		}
	}
	return *chosen, nil
}

// podDeviceID resolves a pod's deviceID on a network with
// allowedPodDevices. What it leads to outside the list (a free device, a
// held one, a function without one, nothing) is refused in the same words,
// which name only the list: a refusal must not tell a pod what the node
// has. The node's log keeps the detail. A device of the list that another
// pod holds is said to be held.
func (c *call) podDeviceID(recs []*state.Record, s config.Source, allowed string) (target, error) {
	t, err := c.byDeviceID(recs, s)
	var held *heldError
	switch {
	case errors.As(err, &held) && slices.Contains(c.conf.AllowedPodDevices, held.rec.Device):
		return target{}, err
	case err != nil:
		c.log.Infof("%s %q leads to no device of allowedPodDevices: %v", s.From, s.Value, err)
		return target{}, refuse(s, allowed)
	case !slices.Contains(c.conf.AllowedPodDevices, t.Name):
		c.log.Infof("%s %q names RDMA device %s, which is not in allowedPodDevices", s.From, s.Value, t.Name)
		return target{}, refuse(s, allowed)
	}
	return t, nil
}

// heldError is a device found held by another attachment's pod.
type heldError struct {
	rec *state.Record
	msg string
}

func (e *heldError) Error() string { return e.msg }

// errHeld says that what, resolved to rec's device, is held by its pod.
func (c *call) errHeld(what string, rec *state.Record) error {
	return &heldError{rec, fmt.Sprintf("the RDMA device of %s (%s) is %s", what, rec.Device, c.heldBy(rec))}
}

// idNames reports whether the device ID id leads to the device t, the way
// resolution by device ID would have found it.
func (c *call) idNames(id string, t target) bool {
	path, err := c.p.Sysfs.PathForDeviceID(id)
	if err != nil {
		return false
	}
	if m, ok := c.p.Sysfs.Direct(path); ok {
		return m.Device.Name == t.Name
	}
	devs, err := c.hostDevices()
	if err != nil {
		return false
	}
	matches := rdmadev.Closest(path, c.p.Sysfs.FallbackFunction(path), devs)
	return len(matches) == 1 && matches[0].Device.Name == t.Name
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
		return target{}, fmt.Errorf("RDMA device %s (from %s) is %s", name, from, c.heldBy(owner))
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
	// The node's devices go to the node's log, not to the pod's events.
	c.log.Infof("RDMA device %s (from %s) is not in the host; the host has %s", name, from, names(devs))
	return target{}, fmt.Errorf("RDMA device %s (from %s) is not in the host network namespace: it does not exist or another netns holds it; the node's log of rdma-netns lists the devices the host has", name, from)
}

// nearest picks the host RDMA device closest to the device at path. The
// devices other attachments hold compete where sysfs last showed them: a
// device another pod holds is reported as held, never replaced by a
// farther one (a sub-function's under a PF whose own device is taken).
func (c *call) nearest(recs []*state.Record, what, path string) (target, error) {
	// The usual case, one device right under the parent, is answered by
	// one directory read instead of a look at every RDMA device on the node.
	if m, ok := c.p.Sysfs.Direct(path); ok {
		return c.found(target{m.Device, fmt.Sprintf("%s: %s", what, m.Relation)}), nil
	}
	fallback := c.p.Sysfs.FallbackFunction(path)
	held := heldRecords(recs, c.key())
	heldDevs := devicesOf(held)
	// Next, the parents' paths alone decide, with the one device chosen
	// checked; anything less clear-cut takes the full look below.
	if cands, exact, err := c.p.Sysfs.Candidates(); err == nil && exact {
		if matches := rdmadev.Closest(path, fallback, slices.Concat(cands, heldDevs)); len(matches) == 1 && heldMatch(held, matches) == nil {
			if d, ok := c.p.Sysfs.Complete(matches[0].Device); ok {
				return c.found(target{d, fmt.Sprintf("%s: %s", what, matches[0].Relation)}), nil
			}
		}
	}
	devs, err := c.hostDevices()
	if err != nil {
		return target{}, err
	}
	matches := rdmadev.Closest(path, fallback, slices.Concat(devs, heldDevs))
	if owner := heldMatch(held, matches); owner != nil {
		return target{}, c.errHeld(what, owner)
	}
	switch len(matches) {
	case 1:
		m := matches[0]
		return c.found(target{m.Device, fmt.Sprintf("%s: %s", what, m.Relation)}), nil
	case 0:
		if owner := ownerOf(recs, c.key(), path, c.p.Sysfs.PCIAddressOf(path)); owner != nil {
			return target{}, c.errHeld(what, owner)
		}
		err := rdmadev.NoMatch(what, path, devs)
		c.log.Infof("%v; RDMA devices in the host: %s", err, rdmadev.Describe(devs))
		return target{}, err
	default:
		return target{}, rdmadev.Ambiguous(what, matches)
	}
}

func (c *call) found(t target) target {
	c.log.Infof("resolved RDMA device %s by %s", t.Name, t.Rule)
	return t
}

// heldRecords are the records of other attachments whose devices are in
// their pods, at the place in the device tree the records keep: the
// devices left the host's sysfs with the move.
func heldRecords(recs []*state.Record, self state.Key) []*state.Record {
	var held []*state.Record
	for _, r := range recs {
		if r.Key != self && r.DevPath != "" && sameNetns(r) {
			held = append(held, r)
		}
	}
	return held
}

func devicesOf(recs []*state.Record) []rdmadev.Device {
	devs := make([]rdmadev.Device, 0, len(recs))
	for _, r := range recs {
		devs = append(devs, rdmadev.Device{Name: r.Device, DevPath: r.DevPath, PCIAddress: r.PCIAddress})
	}
	return devs
}

// heldMatch is the record of the held device among matches, if any.
func heldMatch(held []*state.Record, matches []rdmadev.Match) *state.Record {
	for _, m := range matches {
		for _, r := range held {
			if r.Device == m.Device.Name && r.DevPath == m.Device.DevPath {
				return r
			}
		}
	}
	return nil
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
