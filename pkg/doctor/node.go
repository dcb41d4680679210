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
	Devices         []Device     `json:"devices"`
	// Namespaces are the network namespaces other than the host's that
	// hold RDMA devices.
	Namespaces []*inventory.Namespace `json:"namespaces"`
	// Damaged are record files that could not be read: moved aside into
	// the state directory's damaged/ folder, or still waiting for the
	// plugin's next call to move them there.
	Damaged []string `json:"damaged,omitempty"`
	// NRI is what the doctor found of rdma-netns-nri.
	NRI *NRIView `json:"nri,omitempty"`
}

// RecordView is one attachment record and what became of it.
type RecordView struct {
	Key       string `json:"key"`
	Netns     string `json:"netns"`
	Device    string `json:"device"`
	PodName   string `json:"podDevName,omitempty"`
	State     string `json:"state"`
	File      string `json:"file"`
	NetnsGone bool   `json:"netnsGone"`
	// Status is "ok", "moving", "drift", "vanished" or "stale".
	Status string `json:"status"`
}

const noRDMARemedy = "load the RDMA core and the NIC's RDMA driver (modprobe ib_core ib_uverbs rdma_ucm and mlx5_ib, irdma, bnxt_re or rdma_rxe), " +
	"or keep rdma-netns off nodes without RDMA NICs (nodeSelector on the network attachment's pods)"

// modeFindings checks the netns mode; it returns false when the kernel
// has no RDMA subsystem at all, so the caller can skip what needs one.
func modeFindings(r *Report, k Kernel) (mode string, err error) {
	mode, err = k.NetnsMode()
	switch {
	case err != nil && isNoRDMA(err):
		r.add(Fail, "rdma-subsystem", "node",
			fmt.Sprintf("the kernel has no RDMA subsystem loaded: RDMA netlink answers %q (ib_core is not loaded, or not built into this kernel), so this node has no RDMA devices to give to pods",
				strings.TrimPrefix(err.Error(), rdmans.ErrNoRDMA.Error()+": ")),
			noRDMARemedy)
	case err != nil:
		r.add(Fail, "netns-mode", "node", fmt.Sprintf("cannot read the RDMA netns mode: %v", err),
			"run the doctor as root in the host network namespace; check that ib_core is loaded (lsmod | grep ib_core)")
	case mode == rdmans.ModeExclusive:
		r.add(OK, "netns-mode", "node", "the RDMA subsystem is in exclusive netns mode: each RDMA device belongs to one network namespace", "")
	default:
		r.add(Fail, "netns-mode", "node",
			fmt.Sprintf("the RDMA subsystem is in %s netns mode: every netns sees every RDMA device, so rdma-netns cannot give a device to one pod", mode),
			"add \"options ib_core netns_mode=0\" to /etc/modprobe.d/ib_core.conf (or ib_core.netns_mode=0 on the kernel command line) and reboot; "+
				"or run \"rdma system set netns exclusive\" before any network namespace exists (early at boot, before the container runtime starts)")
	}
	return mode, err
}

func persistFindings(r *Report, n *NodeView) {
	switch {
	case n.NetnsMode == rdmans.ModeExclusive && n.PersistentMode == rdmans.ModeExclusive:
		r.add(OK, "netns-mode-persistent", "node", "exclusive mode is configured to survive a reboot ("+n.Persistent+")", "")
	case n.NetnsMode == rdmans.ModeExclusive && n.PersistentMode == rdmans.ModeShared:
		r.add(Warn, "netns-mode-persistent", "node",
			"exclusive mode is set now, but "+n.Persistent+" selects shared mode: after a reboot or an ib_core reload pods get no isolation",
			"set netns_mode=0 there")
	case n.NetnsMode == rdmans.ModeExclusive:
		r.add(Warn, "netns-mode-persistent", "node",
			"exclusive mode is set now but not configured anywhere (no ib_core netns_mode in /etc/modprobe.d/*.conf or on the kernel command line): after a reboot or an ib_core reload the node is back in shared mode",
			"add \"options ib_core netns_mode=0\" to /etc/modprobe.d/ib_core.conf (and rebuild the initramfs if ib_core loads from it)")
	case n.NetnsMode == rdmans.ModeShared && n.PersistentMode == rdmans.ModeExclusive:
		r.add(Fail, "netns-mode-persistent", "node",
			n.Persistent+" selects exclusive mode but the running kernel is in shared mode: the setting has not taken effect",
			"reboot the node (or reload ib_core and the RDMA drivers); if ib_core loads from the initramfs, rebuild it so it carries the option")
	}
}

// Node runs the node checks.
func Node(e *Env) *Report {
	r := &Report{}
	n := &NodeView{StateDir: e.StateDir, Records: []RecordView{}, Devices: []Device{}, Namespaces: []*inventory.Namespace{}}
	r.Node = n
	mode, modeErr := modeFindings(r, e.Kernel)
	n.NetnsMode = mode
	if modeErr != nil {
		n.ModeError = modeErr.Error()
	}
	n.Persistent, n.PersistentMode = persistentMode(e.EtcRoot, e.Proc.Root)
	if _, err := os.Stat(e.StateDir); err == nil {
		n.StateDirPresent = true
	}
	persistFindings(r, n)
	if modeErr == nil {
		n.NRI = nriFindings(r, e, mode)
	}
	if modeErr != nil {
		// No netlink: list what sysfs shows, if anything, and stop.
		if devs, err := readDevices(e.SysfsRoot, e.DevRoot, nil); err == nil {
			n.Devices = devs
		}
		r.finish()
		return r
	}

	shared := mode != rdmans.ModeExclusive
	recs, damaged, storeErr := e.records()
	if storeErr != nil {
		r.add(Warn, "state", e.StateDir, storeErr.Error(), "check the state directory's permissions")
	}
	n.Damaged = damaged
	for _, f := range damaged {
		r.add(Warn, "damaged-record", f,
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
		r.add(Fail, "devices", "node", err.Error(), "run the doctor as root in the host network namespace")
		r.finish()
		return r
	}
	var devs []Device
	if err := e.SysfsIn("", func(root string) error {
		d, err := readDevices(root, e.DevRoot, snap.Host)
		devs = append(devs, d...)
		return err
	}); err != nil {
		r.add(Warn, "sysfs", "host", fmt.Sprintf("cannot read RDMA device details from sysfs: %v", err), "")
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
			r.add(Warn, "sysfs", ns.Path, fmt.Sprintf("cannot read the details of %s from a sysfs of that netns: %v", strings.Join(ns.Devices, ", "), err), "run the doctor as root (it mounts a private sysfs inside the netns)")
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
	r.Findings = append(r.Findings, findings...)
	for i := range devs {
		if rec := owners[devs[i].Name]; rec != nil {
			devs[i].Location.Owner = rec.Key.String()
		}
	}
	if !shared {
		r.Findings = append(r.Findings, Leaks(devs, owners)...)
	}
	for _, d := range devs {
		deviceFindings(r, d)
	}
	lostNameFindings(r, e, devs)
	if len(devs) == 0 {
		r.add(Warn, "devices", "node", "the RDMA subsystem is loaded but there are no RDMA devices on this node",
			"load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re...) and check `rdma dev`")
	}
	n.Devices = devs
	r.finish()
	return r
}

// lostNameFindings reports host devices that a DEL without a record
// returned under their pod-side name.
func lostNameFindings(r *Report, e *Env, devs []Device) {
	st, err := state.Open(e.StateDir)
	if err != nil {
		return
	}
	notes, _ := st.LostNames()
	for _, d := range devs {
		if note, ok := notes[d.Name]; ok && d.Location.Host {
			r.add(Warn, "lost-host-name", d.Name, note,
				fmt.Sprintf("rename it to the name the driver gives it (as on the node's other devices), then delete %s", filepath.Join(e.StateDir, state.RenamedDir, d.Name)))
		}
	}
}

// Classify compares the attachment records with where the devices are,
// by the inventory's rule. identify resolves a recorded netns path; file
// names a record's file for remedies. It returns a view of each record,
// the findings, and the record holding each device (by host name and by
// pod-side name): only live claims hold devices.
func Classify(recs []*state.Record, snap *inventory.Snapshot, shared bool, identify func(string) (inventory.NetnsID, error), file func(state.Key) string) ([]RecordView, []Finding, map[string]*state.Record) {
	views := []RecordView{}
	var fs []Finding
	owners := map[string]*state.Record{}
	add := func(sev Severity, check, subject, reason, remedy string) {
		fs = append(fs, Finding{Severity: sev, Check: check, Subject: subject, Reason: reason, Remedy: remedy})
	}
	for _, rec := range recs {
		v := RecordView{Key: rec.Key.String(), Netns: rec.Netns, Device: rec.Device, PodName: rec.PodName, State: rec.State, File: file(rec.Key)}
		subj := rec.Key.String()
		name := rec.InPod()
		verdict, where := snap.Judge(rec, identify)
		if shared && verdict == inventory.Returned {
			// Shared mode: every device is in the host and every pod.
			verdict = inventory.Held
		}
		v.NetnsGone = verdict == inventory.NetnsGone
		switch {
		case verdict == inventory.NetnsGone:
			v.Status = "stale"
			at := "it is nowhere on the node"
			switch ns, host := snap.Where(name); {
			case host:
				at = "the device is back in the host"
			case where != nil:
				at = "the device is in netns " + where.Path
			case ns != nil:
				at = "the device is in netns " + ns.Path
			}
			add(Warn, "stale-record", subj,
				fmt.Sprintf("the record of RDMA device %s names pod netns %s, which no longer exists (or is another netns now); %s. It blocks nothing: the next ADD on this node removes it", name, rec.Netns, at),
				fmt.Sprintf("nothing to do; the runtime's DEL or GC of that pod removes it too, or delete %s", v.File))
		case verdict == inventory.Missing:
			v.Status = "vanished"
			add(Fail, "drift", subj,
				fmt.Sprintf("RDMA device %s is recorded in netns %s but no netns on the node has it: its driver was unbound or the device removed", name, rec.Netns),
				"check the NIC and its RDMA driver (dmesg, rdma dev); delete and recreate the pod once the device is back")
		case verdict == inventory.Held:
			owners[rec.Device] = rec
			owners[name] = rec
			if rec.State == state.StateAttached {
				v.Status = "ok"
				add(OK, "record", subj, fmt.Sprintf("RDMA device %s is in netns %s as recorded", name, rec.Netns), "")
			} else {
				v.Status = "moving"
				add(Warn, "record", subj, fmt.Sprintf("RDMA device %s is in netns %s but its ADD did not finish (state %q)", name, rec.Netns, rec.State),
					"the runtime retries ADD or runs DEL for that pod; if neither happens, delete and recreate the pod")
			}
		case verdict == inventory.Returned && rec.State == state.StateMoving:
			v.Status = "moving"
			add(Warn, "record", subj, fmt.Sprintf("an ADD of RDMA device %s into netns %s was interrupted before the device moved; the device is free", name, rec.Netns),
				"the runtime retries ADD or runs DEL for that pod; either clears this, and so does any other ADD on this node")
		default:
			v.Status = "drift"
			at := "host"
			if where != nil {
				at = "netns " + where.Path
			}
			add(Fail, "drift", subj,
				fmt.Sprintf("RDMA device %s is recorded in netns %s but it is in %s: something moved it (rdma dev set, a driver reload) and the pod has lost it", name, rec.Netns, at),
				"delete and recreate the pod (its CHECK fails); DEL cleans the record up")
		}
		views = append(views, v)
	}
	return views, fs, owners
}

// Leaks reports devices outside the host netns that no record owns.
func Leaks(devs []Device, owners map[string]*state.Record) []Finding {
	var fs []Finding
	for _, d := range devs {
		if d.Location.Host || d.Location.Shared || owners[d.Name] != nil {
			continue
		}
		fs = append(fs, Finding{
			Severity: Warn, Check: "leak", Subject: d.Name,
			Reason: fmt.Sprintf("RDMA device %s sits in netns %s, but no rdma-netns record owns it: no pod will get it from rdma-netns", d.Name, d.Location.Netns),
			Remedy: "if nothing put it there on purpose (another CNI plugin, a person), move it back, or delete that network namespace (its devices return to the host); " +
				moveBackCommand(d.Name, d.Location.Netns),
		})
	}
	return fs
}

// moveBackCommand is the iproute2 command returning dev from the netns at
// nsPath, each name quoted for the shell; `rdma dev set` takes only names
// under /run/netns, so the host netns gets one first. It ends the fix, so
// the command runs to the end of the line.
func moveBackCommand(dev, nsPath string) string {
	if !pasteable(dev, nsPath) {
		return notPasteable
	}
	enter := "nsenter --net=" + shellWord(nsPath)
	if dir, name := filepath.Split(nsPath); dir == "/run/netns/" || dir == "/var/run/netns/" {
		enter = "ip netns exec " + shellWord(name)
	}
	return fmt.Sprintf("to move it back: ip netns attach host 1; %s rdma dev set %s netns host", enter, shellWord(dev))
}

// deviceFindings checks what a device needs to be usable wherever it is.
func deviceFindings(r *Report, d Device) {
	subj := d.Name
	before := len(r.Findings)
	defer func() {
		if len(r.Findings) == before {
			r.add(OK, "device", subj, deviceSummary(d), "")
		}
	}()
	for _, p := range d.Ports {
		port := fmt.Sprintf("%s port %d", d.Name, p.Port)
		if p.State != "" && p.State != "ACTIVE" {
			r.add(Warn, "port-state", port, fmt.Sprintf("port state is %s (physical %s), not ACTIVE", p.State, dash(p.PhysState)),
				"check the cable/link and that the netdev is up (ip link set DEV up)")
		}
		if len(p.NetdevsElsewhere) > 0 {
			r.add(Warn, "netdev", port,
				fmt.Sprintf("its netdev %s is not in the same netns as the RDMA device", strings.Join(p.NetdevsElsewhere, ",")),
				"rdma-netns moves the RDMA device after the netdev; a half-done move is fixed by deleting and recreating the pod")
		}
	}
	if len(d.MissingCharDevices) > 0 {
		r.add(Warn, "char-devices", subj,
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
		r.add(Warn, "char-devices", subj, "no /dev/infiniband/uverbs device: verbs applications (NCCL, ibv_devinfo) cannot open it",
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
