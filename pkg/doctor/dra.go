package doctor

import (
	"fmt"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// DRAView is every NIC the node's DRA driver prepared for a pod, and
// where the kernel shows it now.
type DRAView struct {
	Dir     string      `json:"dir"`
	Devices []DRADevice `json:"devices"`
	// Damaged are the records that could not be read ("path: why").
	Damaged []string `json:"damaged,omitempty"`
}

// DRADevice is one device of a prepared claim. Claim, pod, request and
// the names are the record's, as the host named the NIC at Prepare;
// Device and Location are where the kernel shows it now.
type DRADevice struct {
	ClaimUID       string `json:"claimUID"`
	ClaimNamespace string `json:"claimNamespace"`
	ClaimName      string `json:"claimName"`
	PodNamespace   string `json:"podNamespace"`
	PodName        string `json:"podName"`
	PodUID         string `json:"podUID"`
	Request        string `json:"request"`
	PCIAddress     string `json:"pciAddress"`
	Netdev         string `json:"netdev,omitempty"`
	RdmaDevice     string `json:"rdmaDevice,omitempty"`
	// Device is the RDMA device's name now, "" when the doctor did not
	// find it.
	Device   string    `json:"device,omitempty"`
	Location *Location `json:"location,omitempty"`
	// HeldBy is the pod (namespace/name) of the rdma-netns record holding
	// the device, "" if none or the record names no pod.
	HeldBy string `json:"heldBy,omitempty"`
	// Status is "attached", "on-host", "other-pod", "unowned", "missing",
	// "shared" (shared netns mode) or "unknown" (devices not located).
	Status string `json:"status"`
}

// draNode is what the node view found that the DRA check needs: the
// devices with their locations (located false when they could not be
// found, e.g. without RDMA netlink), and the rdma-netns record holding
// each, by the device's current name.
type draNode struct {
	devs    []Device
	holder  map[string]*state.Record
	shared  bool
	located bool
}

// draFindings lists the devices the DRA records name and says where each
// is. A claim's pod that no longer exists cannot be told from one that
// does without the API server, so that is never judged.
func draFindings(fs *Findings, rs draRecords, n draNode) *DRAView {
	if !rs.Present {
		return nil
	}
	v := &DRAView{Dir: rs.Dir, Devices: []DRADevice{}, Damaged: rs.Bad}
	if rs.Err != nil {
		fs.add(Warn, "dra-records", rs.Dir, fmt.Sprintf("cannot read the records of the DRA driver: %v", rs.Err),
			"run the doctor as root; check the directory's permissions")
	}
	for _, b := range rs.Bad {
		fs.add(Warn, "dra-records", rs.Dir,
			"a record of the DRA driver that cannot be read, so its pod's sandbox cannot attach its NICs: "+b,
			"the file is named for the claim's UID: find the claim (kubectl get resourceclaims -A -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,UID:.metadata.uid) and delete its pod; the driver's Unprepare removes the file")
	}
	if n.shared && len(rs.Claims) > 0 {
		fs.add(Warn, "dra-shared-mode", "node",
			fmt.Sprintf("%d ResourceClaim(s) are prepared on this node, but the RDMA subsystem is in shared netns mode, where the DRA driver publishes no devices: these records are from before the mode changed, and their pods get no NIC of their own", len(rs.Claims)),
			"switch the node to exclusive mode (see netns-mode) and reboot; pods whose claims were prepared here must then be deleted and recreated")
	}
	find := n.index()
	for _, c := range rs.Claims {
		for _, d := range c.Devices {
			dv := DRADevice{ClaimUID: c.ClaimUID, ClaimNamespace: c.ClaimNamespace, ClaimName: c.ClaimName,
				PodNamespace: c.PodNamespace, PodName: c.PodName, PodUID: c.PodUID,
				Request: d.Request, PCIAddress: d.PCIAddress, Netdev: d.Netdev, RdmaDevice: d.RdmaDevice}
			switch {
			case n.shared:
				dv.Status = "shared"
			case !n.located:
				dv.Status = "unknown"
			default:
				judgeDRADevice(fs, &dv, find(d.PCIAddress, d.RdmaDevice), n.holder)
			}
			v.Devices = append(v.Devices, dv)
		}
	}
	return v
}

// index finds a device by PCI address, its identity, or when sysfs gave
// none, by the name the host gave it at Prepare (its rdma-netns record
// knows it under that name if a pod renamed it).
func (n draNode) index() func(pci, hostName string) *Device {
	byPCI := map[string]*Device{}
	byName := map[string]*Device{}
	for i := range n.devs {
		d := &n.devs[i]
		if d.PCIAddress != "" {
			byPCI[d.PCIAddress] = d
		}
		byName[d.Name] = d
		if rec := n.holder[d.Name]; rec != nil {
			byName[rec.Device] = d
		}
	}
	return func(pci, hostName string) *Device {
		if d := byPCI[pci]; d != nil {
			return d
		}
		if d := byName[hostName]; d != nil && d.PCIAddress == "" {
			return d
		}
		return nil
	}
}

// judgeDRADevice says where a claimed device is against the pod that
// claims it.
func judgeDRADevice(fs *Findings, dv *DRADevice, d *Device, holder map[string]*state.Record) {
	subj := "claim " + dv.ClaimNamespace + "/" + dv.ClaimName
	pod := dv.PodNamespace + "/" + dv.PodName
	nic := fmt.Sprintf("NIC %s (RDMA device %s, request %s)", dv.PCIAddress, dash(dv.RdmaDevice), dv.Request)
	if d == nil {
		dv.Status = "missing"
		fs.add(Warn, "dra-device", subj,
			fmt.Sprintf("%s is claimed by pod %s but no RDMA device on the node has that PCI address: its RDMA driver was unbound or the NIC removed, or it is in a netns the doctor cannot find", nic, pod),
			"check the NIC and its RDMA driver (dmesg, rdma dev, lspci -s "+dv.PCIAddress+")")
		return
	}
	dv.Device, dv.Location = d.Name, &d.Location
	if rec := holder[d.Name]; rec != nil && rec.K8sPod != "" {
		dv.HeldBy = rec.K8sNamespace + "/" + rec.K8sPod
	}
	switch {
	case d.Location.Host:
		dv.Status = "on-host"
		fs.add(Warn, "dra-device", subj,
			fmt.Sprintf("%s is claimed by pod %s but on the host: its sandbox has not attached it yet, or the NIC was never attached (no network of the pod chains rdma-netns with \"dra\")", nic, pod),
			"if the pod runs, none of its networks attaches the NIC: chain rdma-netns first, with a \"dra\" object, in one of its NetworkAttachmentDefinitions and recreate the pod; if it is starting, "+describePod(dv.PodNamespace, dv.PodName))
	case dv.HeldBy == pod:
		dv.Status = "attached"
		fs.add(OK, "dra-device", subj, fmt.Sprintf("%s is in netns %s of pod %s, which claims it", nic, d.Location.Netns, pod), "")
	case dv.HeldBy != "":
		dv.Status = "other-pod"
		fs.add(Fail, "dra-device", subj,
			fmt.Sprintf("%s is claimed by pod %s but pod %s holds it (netns %s): the claiming pod cannot get it", nic, pod, dv.HeldBy, d.Location.Netns),
			"delete the pod holding it; how it got a NIC the DRA driver gave another pod (a NAD that names the NIC, deviceID) is worth finding out")
	default:
		dv.Status = "unowned"
		fs.add(Warn, "dra-device", subj,
			fmt.Sprintf("%s is claimed by pod %s but sits in netns %s, which no rdma-netns record names a pod for", nic, pod, d.Location.Netns),
			"see the leak finding of the device; "+describePod(dv.PodNamespace, dv.PodName))
	}
}

// describePod is the kubectl command showing a pod's events, each name
// quoted for the shell; it ends the fix.
func describePod(ns, name string) string {
	if !pasteable(ns, name) {
		return notPasteable
	}
	return "its events say why its sandbox failed: kubectl -n " + shellWord(ns) + " describe pod " + shellWord(name)
}

// draSection lists the claimed devices, a line each.
func draSection(v *DRAView) section {
	s := section{heading: "NICs by ResourceClaim (" + v.Dir + ")", none: "none",
		header: []string{"CLAIM", "POD", "REQUEST", "PCI", "RDMA DEVICE", "NOW"}}
	for _, d := range v.Devices {
		now := d.Status
		if d.Location != nil {
			now = d.Device + " in " + d.Location.String()
		}
		s.rows = append(s.rows, []string{d.ClaimNamespace + "/" + d.ClaimName, d.PodNamespace + "/" + d.PodName,
			d.Request, d.PCIAddress, dash(d.RdmaDevice), now})
	}
	return s
}
