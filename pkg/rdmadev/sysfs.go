// Package rdmadev finds, in the host's sysfs, the RDMA device that belongs to
// a network device, so the plugin can move that RDMA device into the pod's
// network namespace together with the netdev.
//
// Everything here reads the kernel's device model (/sys/devices and the
// class and bus views of it) rather than matching names: RDMA device names
// are chosen by drivers and udev (mlx5_0, irdma0, rocep71s0f0, rxe0) and say
// nothing reliable about which netdev they serve, but both hang off the same
// device in the tree.
package rdmadev

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Sysfs reads the kernel's device model under Root ("/sys" in production;
// tests point it at fixture trees).
type Sysfs struct{ Root string }

// Device is an RDMA device visible in the host's sysfs.
type Device struct {
	// Name is the RDMA device name as the kernel knows it (netlink/sysfs),
	// e.g. mlx5_0.
	Name string
	// DevPath is the resolved absolute path of its parent device, e.g.
	// <Root>/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0. Empty if the
	// parent could not be resolved; such a device never matches.
	DevPath string
	// PCIAddress is the PCI function enclosing it (DevPath itself or its
	// nearest ancestor on bus pci), "" if none.
	PCIAddress string
}

// Devices returns every RDMA device in <Root>/class/infiniband, sorted by
// name. A missing class directory means no RDMA core or driver is loaded,
// which is an empty list rather than an error: the caller decides whether
// that is fatal and can say so in its own terms.
func (s Sysfs) Devices() ([]Device, error) {
	return s.list(s.device)
}

// Candidates is Devices with only what Closest reads, the parent's path,
// taken from each class link with one readlink: checking the link and
// finding the PCI address cost three more sysfs operations per device, on
// every ADD that Direct cannot answer, for every device on the node but
// the one chosen (Complete does that one). exact is false when some link
// did not have the kernel's shape; only Devices then has the whole picture.
func (s Sysfs) Candidates() (devs []Device, exact bool, err error) {
	exact = true
	devs, err = s.list(func(classDir, name string) (Device, bool, error) {
		parent, ok := classParent(classDir, name)
		if !ok {
			exact = false
		}
		return Device{Name: name, DevPath: parent}, true, nil
	})
	return devs, exact, err
}

// Complete checks a device from Candidates and adds its PCI address; ok is
// false when it is no longer in the host.
func (s Sysfs) Complete(d Device) (Device, bool) {
	if d.DevPath == "" {
		return d, false
	}
	if _, err := os.Lstat(filepath.Join(d.DevPath, "infiniband", d.Name, "device")); err != nil {
		return d, false
	}
	d.PCIAddress = s.PCIAddressOf(d.DevPath)
	return d, true
}

func (s Sysfs) list(read func(classDir, name string) (Device, bool, error)) ([]Device, error) {
	// Resolved once, so the per-device paths built from class links below
	// are as canonical as EvalSymlinks would make them.
	classDir, err := filepath.EvalSymlinks(filepath.Join(s.Root, "class", "infiniband"))
	if errors.Is(err, fs.ErrNotExist) {
		return []Device{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", filepath.Join(s.Root, "class", "infiniband"), err)
	}
	entries, err := os.ReadDir(classDir)
	if err != nil {
		return nil, fmt.Errorf("list RDMA devices in %s: %w", classDir, err)
	}
	devs := make([]Device, 0, len(entries))
	for _, e := range entries {
		d, ok, err := read(classDir, e.Name())
		if err != nil {
			return nil, err
		}
		if ok {
			devs = append(devs, d)
		}
	}
	slices.SortFunc(devs, func(a, b Device) int { return strings.Compare(a.Name, b.Name) })
	return devs, nil
}

// classParent reads the parent's path from a class/infiniband link:
// device_add puts a class device at <parent>/infiniband/<name> and links the
// class entry to it, so a readlink names the parent. ok is false for a link
// of any other shape (or none).
func classParent(classDir, name string) (string, bool) {
	target, err := os.Readlink(filepath.Join(classDir, name))
	if err != nil {
		return "", false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(classDir, target)
	}
	glue := filepath.Dir(target)
	if filepath.Base(target) != name || filepath.Base(glue) != "infiniband" {
		return "", false
	}
	return filepath.Dir(glue), true
}

// device reads one class/infiniband entry. ok is false when the entry
// vanished while we looked: another pod's ADD may be moving it out of the
// host netns right now, and that must not fail this pod's ADD.
func (s Sysfs) device(classDir, name string) (d Device, ok bool, err error) {
	entry := filepath.Join(classDir, name)
	// An lstat of the `device` link confirms what the readlink says.
	// Resolving that link with EvalSymlinks instead costs a lookup per path
	// element, for every device on the node, on every ADD (measured: 250
	// sysfs operations with 17 devices, a quarter of the plugin's own time).
	if parent, ok := classParent(classDir, name); ok {
		if d, ok := s.Complete(Device{Name: name, DevPath: parent}); ok {
			return d, true, nil
		}
	}
	parent, err := filepath.EvalSymlinks(filepath.Join(entry, "device"))
	if err == nil {
		return Device{Name: name, DevPath: parent, PCIAddress: s.PCIAddressOf(parent)}, true, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Device{}, false, fmt.Errorf("resolve parent device of RDMA device %s: %w", name, err)
	}
	if _, serr := os.Stat(entry); errors.Is(serr, fs.ErrNotExist) {
		return Device{}, false, nil
	}
	// Still listed but without a resolvable parent: keep it so error
	// messages can show the operator what the host has.
	return Device{Name: name}, true, nil
}

// Has reports whether the host sees an RDMA device called name. The class
// directory shows only the devices of the reader's netns, so one lstat
// answers without listing every device on the node.
func (s Sysfs) Has(name string) (bool, error) {
	if err := validName("RDMA device name", name); err != nil {
		return false, err
	}
	_, err := os.Lstat(filepath.Join(s.Root, "class", "infiniband", name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look for RDMA device %s in the host: %w", name, err)
	}
	return true, nil
}

// BusDevicePath resolves <Root>/bus/<bus>/devices/<name> to the device's
// directory under <Root>/devices. bus and name come from pod-controlled
// configuration, so they must each be one plain path element. A missing
// device yields an error that satisfies errors.Is(err, fs.ErrNotExist).
func (s Sysfs) BusDevicePath(bus, name string) (string, error) {
	if err := validName("bus name", bus); err != nil {
		return "", err
	}
	if err := validName("device name", name); err != nil {
		return "", err
	}
	link := filepath.Join(s.Root, "bus", bus, "devices", name)
	p, err := s.busLink(bus, name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &notFoundError{fmt.Sprintf(
			"no %s device %q on this host: %s does not exist; check the device ID and that the device is present and its driver bound",
			bus, name, link)}
	}
	if err != nil {
		return "", fmt.Errorf("resolve %s device %q: %w", bus, name, err)
	}
	return p, nil
}

// busLink resolves bus/<bus>/devices/<name>. The kernel writes that link
// relative, down through real directories to the device's, so a readlink
// and an lstat of the result answer what EvalSymlinks answers with a lookup
// per path element (10 sysfs operations for a virtio NIC, on every ADD).
// Any other shape goes the long way.
func (s Sysfs) busLink(bus, name string) (string, error) {
	link := filepath.Join(s.Root, "bus", bus, "devices", name)
	root, err := filepath.EvalSymlinks(s.Root)
	if err != nil {
		return "", err
	}
	target, err := os.Readlink(link)
	if err != nil && !errors.Is(err, syscall.EINVAL) {
		return "", err
	}
	if err == nil && !filepath.IsAbs(target) {
		p := filepath.Join(root, "bus", bus, "devices", target)
		if strings.HasPrefix(p, filepath.Join(root, "devices")+string(filepath.Separator)) {
			if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
				return p, nil
			}
		}
	}
	return filepath.EvalSymlinks(link)
}

// PathForDeviceID resolves a device ID as Multus and device plugins pass it:
// a PCI address, full ("0000:3b:00.0") or short ("3b:00.0", domain 0000),
// in any case, on bus pci; otherwise an auxiliary device name such as
// mlx5_core.sf.2 (SR-IOV sub-functions, scalable functions) on bus
// auxiliary.
func (s Sysfs) PathForDeviceID(id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("empty device ID: expected a PCI address (e.g. 0000:3b:00.0) or an auxiliary device name (e.g. mlx5_core.sf.2)")
	}
	if addr, ok := normalizePCIAddress(id); ok {
		p, err := s.BusDevicePath("pci", addr)
		if errors.Is(err, fs.ErrNotExist) {
			return "", &notFoundError{fmt.Sprintf(
				"device ID %q: no PCI function %s on this host (%s does not exist); check the deviceID the device plugin passed and that the device is present",
				id, addr, filepath.Join(s.Root, "bus", "pci", "devices", addr))}
		}
		return p, err
	}
	if err := validName("device ID", id); err != nil {
		return "", fmt.Errorf("%w; expected a PCI address (e.g. 0000:3b:00.0) or an auxiliary device name (e.g. mlx5_core.sf.2)", err)
	}
	p, err := s.BusDevicePath("auxiliary", id)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &notFoundError{fmt.Sprintf(
			"device ID %q is not a PCI address and no auxiliary device of that name exists (%s does not exist); expected a PCI address (e.g. 0000:3b:00.0) or an auxiliary device name (e.g. mlx5_core.sf.2)",
			id, filepath.Join(s.Root, "bus", "auxiliary", "devices", id))}
	}
	return p, err
}

// PCIAddressOf returns the nearest PCI function at or above devPath, "" if
// none. A PCI device directory is recognised by its `subsystem` link to
// bus/pci, not by its name: bridges, virtio children and auxiliary devices
// have names that look alike, and only the link is authoritative.
func (s Sysfs) PCIAddressOf(devPath string) string {
	if devPath == "" {
		return ""
	}
	root := filepath.Clean(s.Root)
	for dir := filepath.Clean(devPath); ; dir = filepath.Dir(dir) {
		if onBus(dir, "pci") {
			return filepath.Base(dir)
		}
		if dir == root || dir == filepath.Dir(dir) {
			return ""
		}
	}
}

// onBus reports whether the device directory dir belongs to bus.
func onBus(dir, bus string) bool {
	target, err := os.Readlink(filepath.Join(dir, "subsystem"))
	if err != nil {
		return false
	}
	return filepath.Base(target) == bus && filepath.Base(filepath.Dir(target)) == "bus"
}

// normalizePCIAddress returns [domain:]bus:device.function as sysfs spells
// it: lower case with a domain. Domains wider than four digits exist (Intel
// VMD), so the domain is not fixed-width. Parsed by hand: importing regexp
// costs every exec of the plugin its package init (~1 ms in the test VM).
func normalizePCIAddress(id string) (string, bool) {
	id = strings.ToLower(id)
	domain := "0000"
	if parts := strings.Split(id, ":"); len(parts) == 3 {
		if len(parts[0]) < 4 || len(parts[0]) > 8 || !isHex(parts[0]) {
			return "", false
		}
		domain, id = parts[0], id[len(parts[0])+1:]
	}
	// bb:dd.f
	if len(id) != 7 || id[2] != ':' || id[5] != '.' || !isHex(id[:2]) || !isHex(id[3:5]) || id[6] < '0' || id[6] > '7' {
		return "", false
	}
	return domain + ":" + id, true
}

// IsPCIAddress reports whether s is a PCI address as sysfs spells it
// (domain:bus:device.function, lower case): what a record may hand
// host-device as a path element under /sys/bus/pci/devices.
func IsPCIAddress(s string) bool {
	n, ok := normalizePCIAddress(s)
	return ok && n == s
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validName rejects anything that is not exactly one path element, because
// the value is joined into a path under Root.
func validName(kind, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty %s", kind)
	case v == ".", strings.Contains(v, ".."), strings.ContainsAny(v, "/\\\x00"):
		return fmt.Errorf("invalid %s %q: must be a single sysfs name without '/' or '..'", kind, v)
	}
	return nil
}

// notFoundError carries a precise message while still answering
// errors.Is(err, fs.ErrNotExist), so callers can tell "absent" from "broken"
// without the message repeating the raw lstat error.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string        { return e.msg }
func (e *notFoundError) Is(target error) bool { return target == fs.ErrNotExist }

// FallbackFunction returns the PCI function whose RDMA devices may serve the
// device at devPath when none sits under devPath itself: its enclosing PCI
// function, except for auxiliary devices. An mlx5 sub-function has its own
// RDMA device; when that one is gone (already in a pod), falling back to the
// PF's device would hand the host's RDMA device to this pod.
func (s Sysfs) FallbackFunction(devPath string) string {
	if onBus(devPath, "auxiliary") {
		return ""
	}
	return s.PCIAddressOf(devPath)
}
