package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// NodeView is the node as the doctor saw it.
type NodeView struct {
	NetnsMode string `json:"netnsMode"`
	ModeError string `json:"modeError,omitempty"`
	// Persistent names where the mode is configured for the next boot,
	// e.g. "/etc/modprobe.d/ib_core.conf: exclusive"; "" if nowhere.
	Persistent string `json:"persistent"`
	// PersistentMode is the mode that configuration selects.
	PersistentMode string `json:"persistentMode,omitempty"`
	StateDir       string `json:"stateDir"`
	// StateDirPresent is false where rdma-netns never ran.
	StateDirPresent bool         `json:"stateDirPresent"`
	Records         []RecordView `json:"records"`
	// Reservations are the RDMA device names reserved on the node, each
	// for the network that gives its pods that name.
	Reservations []Reservation `json:"reservations"`
	Devices      []Device      `json:"devices"`
	// Namespaces are the network namespaces other than the host's that
	// hold RDMA devices.
	Namespaces []*inventory.Namespace `json:"namespaces"`
	// Damaged are record files that could not be read: moved aside into
	// the state directory's damaged/ folder, or still waiting for the
	// plugin's next call to move them there.
	Damaged []string `json:"damaged,omitempty"`
	// NRI is what the doctor found of rdma-netns-nri.
	NRI *NRIView `json:"nri,omitempty"`
	// DRA is what the node's DRA driver prepared, and where each of its
	// devices is; nil where its record directory does not exist.
	DRA *DRAView `json:"dra,omitempty"`
}

// nodeChecks runs the node checks: it adds their findings to fs and
// returns what it saw of the node.
func nodeChecks(e *Env, fs *Findings) *NodeView {
	n := &NodeView{StateDir: e.StateDir, Records: []RecordView{}, Reservations: []Reservation{}, Devices: []Device{}, Namespaces: []*inventory.Namespace{}}
	mode, modeErr := modeFindings(fs, e.Kernel)
	n.NetnsMode = mode
	if modeErr != nil {
		n.ModeError = modeErr.Error()
	}
	n.Persistent, n.PersistentMode = persistentMode(e.EtcRoot, e.Proc.Root)
	if _, err := os.Stat(e.StateDir); err == nil {
		n.StateDirPresent = true
	}
	res, resErr := e.reservations()
	if resErr != nil {
		fs.add(Warn, "state", filepath.Join(e.StateDir, state.ReservedDir), fmt.Sprintf("cannot read the RDMA device names reserved on this node: %v", resErr),
			"check the state directory's permissions")
	}
	n.Reservations = res
	persistFindings(fs, n.NetnsMode, n.Persistent, n.PersistentMode)
	claimsEntryFindings(fs, e, e.draRecords())
	if modeErr == nil {
		n.NRI = nriFindings(fs, e, mode)
	}
	if modeErr != nil {
		// No netlink: list what sysfs shows, if anything, and stop.
		if devs, err := readDevices(e.SysfsRoot, e.DevRoot, nil); err == nil {
			n.Devices = devs
		}
		n.DRA = draFindings(fs, e.draRecords(), draNode{})
		return n
	}

	shared := mode != rdmans.ModeExclusive
	recs, damaged, storeErr := e.records()
	if storeErr != nil {
		fs.add(Warn, "state", e.StateDir, storeErr.Error(), "check the state directory's permissions")
	}
	n.Damaged = damaged
	for _, f := range damaged {
		fs.add(Warn, "damaged-record", f,
			"an attachment record that cannot be read; it blocks no pod (the plugin keeps it out of the way in "+state.DamagedDir+"/) and the device it named is found from the kernel when its pod is deleted",
			"read it if you want to know what happened, then delete it")
	}

	// Where is every device now?
	inv := e.inventory()
	var snap *inventory.Snapshot
	var err error
	if shared {
		// Every netns sees every device: listing each says nothing.
		snap, err = inv.ScanHost()
	} else {
		snap, err = inv.Scan(recs)
	}
	if err != nil {
		fs.add(Fail, "devices", "node", err.Error(), "run the doctor as root in the host network namespace")
		n.DRA = draFindings(fs, e.draRecords(), draNode{shared: shared})
		return n
	}
	var devs []Device
	if err := e.SysfsIn("", func(root string) error {
		d, err := readDevices(root, e.DevRoot, snap.Host)
		devs = append(devs, d...)
		return err
	}); err != nil {
		fs.add(Warn, "sysfs", "host", fmt.Sprintf("cannot read RDMA device details from sysfs: %v", err), "")
		devs = namesOnly(snap.Host)
	}
	for i := range devs {
		devs[i].Location = Location{Host: !shared, Shared: shared}
	}
	for _, ns := range snap.Namespaces {
		n.Namespaces = append(n.Namespaces, ns)
		if ns.Err != "" {
			continue
		}
		var got []Device
		if err := e.SysfsIn(ns.Path, func(root string) error {
			d, err := readDevices(root, e.DevRoot, ns.Devices)
			got = d
			return err
		}); err != nil {
			fs.add(Warn, "sysfs", ns.Path, fmt.Sprintf("cannot read the details of %s from a sysfs of that netns: %v", strings.Join(ns.Devices, ", "), err), "run the doctor as root (it mounts a private sysfs inside the netns)")
			got = namesOnly(ns.Devices)
		}
		for i := range got {
			got[i].Location = Location{Netns: ns.Path, Inode: ns.ID.Ino}
		}
		devs = append(devs, got...)
	}
	sort.SliceStable(devs, func(i, j int) bool { return devs[i].Name < devs[j].Name })

	// Records against what we saw.
	views, findings, owners := Classify(recs, snap, shared, e.NetnsOf, e.recordFile)
	n.Records = views
	*fs = append(*fs, findings...)
	for i := range devs {
		if rec := owners[devs[i].Name]; rec != nil {
			devs[i].Location.Owner = rec.Key.String()
		}
	}
	if !shared {
		*fs = append(*fs, Leaks(devs, owners)...)
	}
	for _, d := range devs {
		deviceFindings(fs, d)
	}
	lostNameFindings(fs, e, devs)
	if len(devs) == 0 {
		fs.add(Warn, "devices", "node", "the RDMA subsystem is loaded but there are no RDMA devices on this node",
			"load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re...) and check `rdma dev`")
	}
	n.Devices = devs
	holder := map[string]*state.Record{}
	for _, d := range devs {
		if rec := owners[d.Name]; rec != nil {
			holder[d.Name] = rec
		}
	}
	n.DRA = draFindings(fs, e.draRecords(), draNode{devs: devs, holder: holder, shared: shared, located: true})
	return n
}

// sections are the node view in the text report.
func (n *NodeView) sections() []section {
	mode := n.NetnsMode
	if mode == "" {
		mode = "unavailable"
		if n.ModeError != "" {
			mode += " (" + n.ModeError + ")"
		}
	}
	persist := "not configured"
	if n.Persistent != "" {
		persist = n.Persistent
	}
	stateDir := n.StateDir + " (not present)"
	if n.StateDirPresent {
		stateDir = fmt.Sprintf("%s (%d record(s))", n.StateDir, len(n.Records))
	}
	s := []section{
		{heading: "RDMA subsystem", rows: [][]string{
			{"netns mode", mode},
			{"persistent setting", persist},
			{"state directory", stateDir},
		}},
		devicesSection("RDMA devices", n.Devices, true),
		reservationsSection(n.Reservations),
	}
	if n.DRA != nil {
		s = append(s, draSection(n.DRA))
	}
	return s
}

// reservationsSection lists the names reserved on the node: a name stays
// reserved for its network until someone deletes its file
// (docs/doctor.md says when that is safe).
func reservationsSection(res []Reservation) section {
	s := section{heading: "RDMA device names reserved", none: "none", header: []string{"NAME", "NETWORK", "FILE"}}
	for _, r := range res {
		s.rows = append(s.rows, []string{r.Name, r.Network, r.File})
	}
	return s
}
