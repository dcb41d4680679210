// Package rdmans moves RDMA devices between network namespaces through
// RDMA netlink, the same interface `rdma dev set ... netns` uses.
package rdmans

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// The kernel's two netns modes for the RDMA subsystem.
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// ErrNoRDMA means the kernel has no RDMA netlink at all: ib_core is not
// loaded or not built.
var ErrNoRDMA = errors.New("the kernel's RDMA subsystem does not answer (is ib_core loaded?)")

// Netlink is the production implementation, talking to the running kernel.
type Netlink struct{}

// netnsModeParam is ib_core's netns_mode parameter. It shows the variable
// RDMA netlink reports and `rdma system set netns` changes (Y shared, N
// exclusive), for a file read instead of a netlink socket and request.
const netnsModeParam = "/sys/module/ib_core/parameters/netns_mode"

// NetnsMode reports the RDMA subsystem's netns mode.
func (Netlink) NetnsMode() (string, error) {
	if b, err := os.ReadFile(netnsModeParam); err == nil {
		if mode := modeOfParam(b); mode != "" {
			return mode, nil
		}
	}
	mode, err := netlink.RdmaSystemGetNetnsMode()
	if err != nil {
		return "", classify(err)
	}
	return mode, nil
}

// modeOfParam reads the netns_mode parameter's value, "" if it is neither
// boolean the kernel prints.
func modeOfParam(b []byte) string {
	switch strings.TrimSpace(string(b)) {
	case "Y":
		return ModeShared
	case "N":
		return ModeExclusive
	}
	return ""
}

// InHost reports whether the named device is in the caller's netns.
func (Netlink) InHost(name string) (found bool, err error) {
	err = withRDMA(func(h *netlink.Handle) error {
		d, err := lookup(h, name)
		found = d != nil
		return err
	})
	return found, err
}

// HostDevices lists the RDMA devices of the caller's netns.
func (Netlink) HostDevices() ([]string, error) {
	links, err := Links()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Attrs.Name)
	}
	return names, nil
}

// InNetns reports whether the named device is in the netns at nsPath.
func (Netlink) InNetns(nsPath, name string) (bool, error) {
	var found bool
	err := podns.Do(nsPath, func(podns.Thread) error {
		return withRDMA(func(h *netlink.Handle) error {
			d, err := lookup(h, name)
			found = d != nil
			return err
		})
	}, podns.CallerThread())
	return found, err
}

// DevicesIn lists the RDMA devices in the netns at nsPath.
func (Netlink) DevicesIn(nsPath string) ([]string, error) {
	var names []string
	err := podns.Do(nsPath, func(podns.Thread) error {
		var err error
		names, err = Netlink{}.HostDevices()
		return err
	}, podns.CallerThread())
	return names, err
}

// NoIndex is a hint that names no device: ib_core gives indexes below 2^31
// (xa_limit_31b), starting at 0, so the largest uint32 is never one.
const NoIndex = ^uint32(0)

// MoveToNetns moves a device of the caller's netns into the netns at nsPath
// and returns the device's index, by which the kernel moved it. hint is an
// index the device had before (NoIndex for none): one request checks that it
// still names this device in the caller's netns, which spares the dump of
// every device there (on 6.1, one message per device), and a hint that no
// longer holds (a reboot, a driver reload) costs that one request before
// the dump. The kernel keeps an index for a device's whole life, across
// moves and renames, and never gives it to two devices at once.
func (Netlink) MoveToNetns(name, nsPath string, hint uint32) (uint32, error) {
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return 0, fmt.Errorf("failed to open netns %s: %v", nsPath, err)
	}
	defer target.Close()
	var index uint32
	err = withRDMA(func(h *netlink.Handle) error {
		var d *netlink.RdmaLink
		if IsAt(hint, name) {
			d = &netlink.RdmaLink{Attrs: netlink.RdmaLinkAttrs{Index: hint, Name: name}}
		} else if d, err = lookup(h, name); err != nil {
			return err
		}
		if d == nil {
			return fmt.Errorf("RDMA device %s is not in the host network namespace", name)
		}
		if err := h.RdmaLinkSetNsFd(d, uint32(target)); err != nil {
			return fmt.Errorf("failed to move RDMA device %s into netns %s: %v", name, nsPath, classify(err))
		}
		index = d.Attrs.Index
		return nil
	})
	return index, err
}

// IsAt reports whether the calling thread's netns has the device called
// name at index: false for NoIndex, no device there, another device, or
// any error (a caller then looks the name up in a dump).
func IsAt(index uint32, name string) bool {
	if index == NoIndex {
		return false
	}
	req := nldevRequest(nl.RDMA_NLDEV_CMD_GET, unix.NLM_F_ACK)
	req.AddData(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, nl.Uint32Attr(index)))
	msgs, err := req.Execute(unix.NETLINK_RDMA, 0)
	if err != nil || len(msgs) != 1 {
		return false
	}
	got, at := devNameIndex(msgs[0])
	return got == name && at == index
}

// devNameIndex reads the name and index of one RDMA_NLDEV_CMD_GET answer.
func devNameIndex(msg []byte) (name string, index uint32) {
	attrs, err := nl.ParseRouteAttr(msg)
	if err != nil {
		return "", 0
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case nl.RDMA_NLDEV_ATTR_DEV_NAME:
			name = strings.TrimRight(string(a.Value), "\x00")
		case nl.RDMA_NLDEV_ATTR_DEV_INDEX:
			if len(a.Value) >= 4 {
				index = nl.NativeEndian().Uint32(a.Value)
			}
		}
	}
	return name, index
}

// MoveToHost moves a device from the netns at nsPath back to the caller's
// netns. The kernel looks the device up in the netns of the netlink socket,
// so the request must come from inside the pod.
func (Netlink) MoveToHost(name, nsPath string) error {
	return podns.Do(nsPath, func(t podns.Thread) error {
		return withRDMA(func(h *netlink.Handle) error {
			d, err := lookup(h, name)
			if err != nil {
				return err
			}
			if d == nil {
				return fmt.Errorf("RDMA device %s is not in netns %s", name, nsPath)
			}
			if err := h.RdmaLinkSetNsFd(d, uint32(t.From)); err != nil {
				return fmt.Errorf("failed to move RDMA device %s from netns %s back to the host: %v", name, nsPath, classify(err))
			}
			return nil
		})
	}, podns.CallerThread())
}

// Release brings a device back from the netns at nsPath to the caller's
// netns under hostName, in one visit to the pod and one device dump: it
// looks for the device as podName (when set and different) and then as
// hostName, renames it back when it carries podName, and moves it. The
// kernel keeps a device's index across renames and moves, so the index
// from the dump serves every request. found is false, with no error, when
// the pod has the device under neither name. With nic.HostName set, the
// same visit then readies the pod's NIC for host-device's DEL
// (RestoreNIC), wherever the device was.
func (Netlink) Release(nsPath, hostName, podName string, nic NIC) (found bool, fix NICFix, err error) {
	err = podns.Do(nsPath, func(t podns.Thread) error {
		err := withRDMA(func(h *netlink.Handle) error {
			found, err = release(h, t, nsPath, hostName, podName)
			return err
		})
		if err != nil || nic.HostName == "" {
			return err
		}
		if fix, err = restoreNIC(nic); err != nil {
			return fmt.Errorf("cannot give NIC %s back its host name %s in netns %s for host-device: %v", nic.IfName, nic.HostName, nsPath, err)
		}
		return nil
	}, podns.CallerThread())
	return found, fix, err
}

// release is Release's RDMA part, in the pod's netns.
func release(h *netlink.Handle, t podns.Thread, nsPath, hostName, podName string) (found bool, err error) {
	devs, err := devices(h)
	if err != nil {
		return false, fmt.Errorf("cannot list the RDMA devices in netns %s: %v", nsPath, err)
	}
	d, asPodName := pick(devs, hostName, podName)
	if d == nil {
		return false, nil
	}
	if asPodName {
		if err := h.RdmaLinkSetName(d, hostName); err != nil {
			return true, fmt.Errorf("cannot restore the name of RDMA device %s (called %s in the pod): %v", hostName, podName, classify(err))
		}
	}
	if err := h.RdmaLinkSetNsFd(d, uint32(t.From)); err != nil {
		return true, fmt.Errorf("failed to move RDMA device %s from netns %s back to the host: %v", hostName, nsPath, classify(err))
	}
	return true, nil
}

// pick finds the device under its pod-side name first: a host name alone
// may belong to another device once the device was renamed. nil when the
// pod has neither name.
func pick(devs []*netlink.RdmaLink, hostName, podName string) (d *netlink.RdmaLink, asPodName bool) {
	for _, d := range devs {
		if podName != "" && podName != hostName && d.Attrs.Name == podName {
			return d, true
		}
	}
	for _, d := range devs {
		if d.Attrs.Name == hostName {
			return d, false
		}
	}
	return nil, false
}

// Rename renames a device in the netns at nsPath ("" for the caller's).
func (Netlink) Rename(nsPath, from, to string) error {
	rename := func() error {
		return withRDMA(func(h *netlink.Handle) error {
			d, err := lookup(h, from)
			if err != nil {
				return err
			}
			if d == nil {
				return fmt.Errorf("RDMA device %s not found", from)
			}
			if err := h.RdmaLinkSetName(d, to); err != nil {
				return fmt.Errorf("failed to rename RDMA device %s to %s: %v", from, to, classify(err))
			}
			return nil
		})
	}
	if nsPath == "" {
		return rename()
	}
	return podns.Do(nsPath, func(podns.Thread) error { return rename() }, podns.CallerThread())
}

// The plugin talks to the kernel through the netlink package, with one
// handle, and so one socket, per step: a step's lookup and move, or DEL's
// dump, rename and move inside the pod, share it. A request loop of our own
// that decodes only each device's index and name (conn.go, removed) was
// measured natively at 0.21 ms for the first netdev lookup in a pod against
// the package's 0.42 ms, and 0.001 ms against 0.04 ms to decode a 17-device
// RDMA dump: well below the 1 ms per ADD+DEL that CONTRIBUTING.md asks of
// a copy of a dependency's code. (In the test VM's emulated CPU the same
// difference looked like 3.5 ms per lookup.)

// netlinkTimeout bounds a request: the kernel answers these at once, so
// only a kernel gone wrong ever hits it.
const netlinkTimeout = 30 * time.Second

// withRDMA runs fn with a netlink handle on an RDMA netlink socket of the
// calling thread's netns.
func withRDMA(fn func(h *netlink.Handle) error) error {
	return withHandle(unix.NETLINK_RDMA, fn)
}

// withHandle runs fn with a netlink handle on a socket of family in the
// calling thread's netns, its requests bounded by netlinkTimeout. A family
// the kernel lacks is ErrNoRDMA: of the two used, only RDMA netlink can be
// missing (ib_core not loaded); rtnetlink is always there.
func withHandle(family int, fn func(h *netlink.Handle) error) error {
	h, err := netlink.NewHandle(family)
	if err != nil {
		return classify(err)
	}
	defer h.Close()
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		return err
	}
	return fn(h)
}

// devices lists the RDMA devices of the handle's netns, retrying dumps the
// kernel marked as interrupted: a device moving while we read must not
// make us believe it is gone.
func devices(h *netlink.Handle) ([]*netlink.RdmaLink, error) {
	for i := 0; ; i++ {
		links, err := h.RdmaLinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 5 {
			runtime.Gosched()
			continue
		}
		if err != nil {
			return nil, classify(err)
		}
		return links, nil
	}
}

// lookupDumps bounds the device dumps lookup makes before it calls a
// device absent.
const lookupDumps = 3

// lookup finds the named device among those of the handle's netns, nil if
// it is not there. The kernel's device dump is not a snapshot: when it
// spans several messages (a dozen devices or more), the next message
// resumes at a position among the netns' devices, so a device that leaves
// the netns meanwhile (another pod's move) shifts the rest and one is
// skipped, without NLM_F_DUMP_INTR. A device missing from the dump is
// looked for again before it is declared absent.
func lookup(h *netlink.Handle, name string) (*netlink.RdmaLink, error) {
	for i := 0; i < lookupDumps; i++ {
		devs, err := devices(h)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			if d.Attrs.Name == name {
				return d, nil
			}
		}
	}
	return nil, nil
}

// Links lists the RDMA devices of the calling thread's netns.
func Links() ([]*netlink.RdmaLink, error) {
	var links []*netlink.RdmaLink
	err := withRDMA(func(h *netlink.Handle) (err error) {
		links, err = devices(h)
		return err
	})
	return links, err
}

func classify(err error) error {
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("%w: %v", ErrNoRDMA, err)
	}
	return err
}
