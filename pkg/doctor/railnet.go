package doctor

import (
	"errors"
	"fmt"
	"github.com/rdma-netns/rdma-netns/pkg/podns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// RailNet is what the rails check asks the kernel inside the pod's netns.
type RailNet interface {
	// IPv4Addrs lists the IPv4 addresses of netdev, of every netdev for "".
	IPv4Addrs(netdev string) ([]netip.Prefix, error)
	// ARPConf reads net.ipv4.conf.<netdev>.<key> (netdev "all" for the
	// namespace-wide value).
	ARPConf(netdev, key string) (int, error)
	// RouteNetdev names the netdev the route from src to dst leaves by
	// (ip route get DST from SRC).
	RouteNetdev(src, dst netip.Addr) (string, error)
}

// railNetIn runs fn with the kernel's answers from inside the netns at
// nsPath, on a thread that joined it: /proc/sys/net shows the netns of the
// thread that reads it, and rtnetlink sockets belong to the netns of the
// thread that opens them.
func railNetIn(nsPath string, fn func(RailNet) error) error {
	return podns.Do(nsPath, func(podns.Thread) error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		// The kernel answers at once; only a kernel gone wrong hits it.
		if err := h.SetSocketTimeout(30 * time.Second); err != nil {
			return err
		}
		return fn(kernelNet{h: h, procSys: "/proc/sys"})
	})
}

// kernelNet answers RailNet from the calling thread's netns.
type kernelNet struct {
	h       *netlink.Handle
	procSys string
}

func (k kernelNet) IPv4Addrs(netdev string) ([]netip.Prefix, error) {
	var link netlink.Link
	if netdev != "" {
		l, err := k.h.LinkByName(netdev)
		if err != nil {
			return nil, fmt.Errorf("netdev %s: %w", netdev, err)
		}
		link = l
	}
	var addrs []netlink.Addr
	var err error
	for i := 0; ; i++ {
		addrs, err = k.h.AddrList(link, netlink.FAMILY_V4)
		// A dump the kernel marks as interrupted (an address changed
		// meanwhile) is asked again rather than believed.
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 5 {
			runtime.Gosched()
			continue
		}
		break
	}
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out, nil
}

func (k kernelNet) ARPConf(netdev, key string) (int, error) {
	b, err := os.ReadFile(filepath.Join(k.procSys, "net", "ipv4", "conf", netdev, key))
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func (k kernelNet) RouteNetdev(src, dst netip.Addr) (string, error) {
	routes, err := k.h.RouteGetWithOptions(net.IP(dst.AsSlice()), &netlink.RouteGetOptions{SrcAddr: net.IP(src.AsSlice())})
	if err != nil {
		return "", err
	}
	if len(routes) == 0 || routes[0].LinkIndex == 0 {
		return "", errors.New("the kernel answered no output netdev")
	}
	l, err := k.h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("netdev of index %d: %w", routes[0].LinkIndex, err)
	}
	return l.Attrs().Name, nil
}
