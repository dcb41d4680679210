// Command rdma-netns-floor is the least a CNI plugin moving an RDMA device
// can do, as a process: `make bench` times it next to rdma-netns.
//
//	rdma-netns-floor                  start and exit (the start-up floor)
//	rdma-netns-floor in DEV NETNS     look DEV up in the host, move it into NETNS
//	rdma-netns-floor out DEV NETNS    enter NETNS, look DEV up, move it to the host
//
// It links only netlink and netns, checks nothing and keeps no state.
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func main() {
	if len(os.Args) == 1 {
		return
	}
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: rdma-netns-floor [in|out DEV NETNS]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "in":
		err = moveIn(os.Args[2], os.Args[3])
	case "out":
		err = moveOut(os.Args[2], os.Args[3])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdma-netns-floor: %v\n", err)
		os.Exit(1)
	}
}

func moveIn(dev, nsPath string) error {
	pod, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer pod.Close()
	link, err := byName(dev)
	if err != nil {
		return err
	}
	return netlink.RdmaLinkSetNsFd(link, uint32(pod))
}

// moveOut requests the move from inside the pod: the kernel looks the
// device up in the caller's netns and moves it only from there.
func moveOut(dev, nsPath string) error {
	runtime.LockOSThread() // the thread stays in the pod; the process exits
	host, err := netns.Get()
	if err != nil {
		return err
	}
	pod, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	if err := netns.Set(pod); err != nil {
		return err
	}
	link, err := byName(dev)
	if err != nil {
		return err
	}
	return netlink.RdmaLinkSetNsFd(link, uint32(host))
}

// byName looks the device up by a dump, as any client must (the kernel
// moves a device by index only), and dumps again when it is missing: a
// dump that spans several messages can skip a device while other devices
// leave the netns (pods started at once), as rdma-netns's lookup does.
func byName(dev string) (*netlink.RdmaLink, error) {
	var err error
	for i := 0; i < 3; i++ {
		var link *netlink.RdmaLink
		if link, err = netlink.RdmaLinkByName(dev); err == nil {
			return link, nil
		}
	}
	return nil, err
}
