package doctor

import (
	"fmt"
	"path/filepath"
	"strings"
)

// deviceFindings checks what a device needs to be usable wherever it is.
func deviceFindings(fs *Findings, d Device) {
	subj := d.Name
	before := len(*fs)
	defer func() {
		if len(*fs) == before {
			fs.add(OK, "device", subj, deviceSummary(d), "")
		}
	}()
	for _, p := range d.Ports {
		port := fmt.Sprintf("%s port %d", d.Name, p.Port)
		if p.State != "" && p.State != "ACTIVE" {
			fs.add(Warn, "port-state", port, fmt.Sprintf("port state is %s (physical %s), not ACTIVE", p.State, dash(p.PhysState)),
				"check the cable/link and that the netdev is up (ip link set DEV up)")
		}
		if len(p.NetdevsElsewhere) > 0 {
			fs.add(Warn, "netdev", port,
				fmt.Sprintf("its netdev %s is not in the same netns as the RDMA device", strings.Join(p.NetdevsElsewhere, ",")),
				"rdma-netns moves the RDMA device after the netdev; a half-done move is fixed by deleting and recreating the pod")
		}
	}
	if len(d.MissingCharDevices) > 0 {
		fs.add(Warn, "char-devices", subj,
			fmt.Sprintf("the kernel registered %s but the node's /dev lacks them", strings.Join(d.MissingCharDevices, " ")),
			"check udev/devtmpfs on the node")
	}
	hasUverbs := false
	for _, c := range d.CharDevices {
		if strings.Contains(filepath.Base(c), "uverbs") {
			hasUverbs = true
		}
	}
	if !hasUverbs && len(d.Ports) > 0 {
		fs.add(Warn, "char-devices", subj, "no /dev/infiniband/uverbs device: verbs applications (NCCL, ibv_devinfo) cannot open it",
			"modprobe ib_uverbs (and rdma_ucm for rdma_cm)")
	}
}

// deviceSummary says in one line where a healthy device is and what it has.
func deviceSummary(d Device) string {
	parts := []string{"in " + d.Location.String()}
	if d.Driver != "" {
		parts = append(parts, "driver "+d.Driver)
	}
	if d.PCIAddress != "" {
		parts = append(parts, "PCI "+d.PCIAddress)
	}
	for _, p := range d.Ports {
		parts = append(parts, fmt.Sprintf("port %d %s netdev %s, %d GIDs", p.Port, dash(p.State), dash(strings.Join(p.Netdevs, ",")), p.GIDs))
	}
	if len(d.CharDevices) > 0 {
		parts = append(parts, strings.Join(baseNames(d.CharDevices), " "))
	}
	return strings.Join(parts, "; ")
}

// podDeviceFindings checks what a device in a pod needs: GIDs, a netdev in
// the pod for a RoCE port, an active port.
func podDeviceFindings(fs *Findings, d Device) {
	before := len(*fs)
	for _, port := range d.Ports {
		subj := fmt.Sprintf("%s port %d", d.Name, port.Port)
		switch {
		case port.GIDs == 0:
			fs.add(Fail, "gids", subj, "the port's GID table is empty: RoCE traffic and rdma_cm cannot address it (NCCL fails to find a GID)",
				"bring the pod's netdev up and give it an IP address (the IPAM of the chain); a GID entry appears for each address")
		case len(port.Netdevs) == 0 && port.LinkLayer == "Ethernet":
			fs.add(Warn, "netdev", subj, "no netdev is associated with this RoCE port", "check that the pod's netdev belongs to this device (rdma link)")
		case len(port.NetdevsElsewhere) > 0:
			fs.add(Warn, "netdev", subj, fmt.Sprintf("its netdev %s is not in this netns", strings.Join(port.NetdevsElsewhere, ",")),
				"rdma-netns moves the RDMA device with the netdev; recreate the pod")
		}
		if port.State != "" && port.State != "ACTIVE" {
			fs.add(Warn, "port-state", subj, fmt.Sprintf("port state is %s (physical %s), not ACTIVE", port.State, dash(port.PhysState)),
				"check the link and that the pod's netdev is up")
		}
	}
	if len(*fs) == before {
		fs.add(OK, "device", d.Name, deviceSummary(d), "")
	}
}

// devicesSection is a table of devs, a line per port; withLocation adds
// the netns each is in.
func devicesSection(heading string, devs []Device, withLocation bool) section {
	s := section{heading: heading, none: "none",
		header: []string{"DEVICE", "DRIVER", "PCI", "PORT", "STATE", "NETDEV", "GIDS", "CHAR DEVICES"}}
	if withLocation {
		s.header = append(s.header, "LOCATION")
	}
	for _, d := range devs {
		ports := d.Ports
		if len(ports) == 0 {
			ports = []Port{{}}
		}
		for i, p := range ports {
			name, driver, pci, chars, loc := d.Name, dash(d.Driver), dash(d.PCIAddress), dash(strings.Join(baseNames(d.CharDevices), " ")), d.Location.String()
			if i > 0 {
				name, driver, pci, chars, loc = "", "", "", "", ""
			}
			port, gids := "-", "-"
			if p.Port != 0 {
				port, gids = fmt.Sprint(p.Port), fmt.Sprint(p.GIDs)
			}
			row := []string{name, driver, pci, port, dash(p.State), dash(strings.Join(p.Netdevs, ",")), gids, chars}
			if withLocation {
				row = append(row, loc)
			}
			s.rows = append(s.rows, row)
		}
	}
	return s
}
