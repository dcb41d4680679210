package doctor

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// PodView is one pod's network namespace as the doctor saw it.
type PodView struct {
	Netns     string   `json:"netns"`
	Inode     uint64   `json:"inode"`
	NetnsMode string   `json:"netnsMode"`
	Devices   []Device `json:"devices"`
	// VerbsNodes are the /dev/infiniband nodes a verbs application of the
	// pod opens: the uverbs node of each of its devices, and rdma_cm.
	VerbsNodes []string `json:"verbsNodes"`
	// Rails are the ports of its devices with their netdevs, addresses,
	// RoCE v2 GIDs, ARP settings and routes.
	Rails     []Rail    `json:"rails"`
	Processes []Process `json:"processes"`
	// NICs are its devices' PCI functions with their PCIe root and NUMA
	// node; GPUs the GPUs its processes can open or --gpus names, each
	// with the NICs near it.
	NICs []NIC          `json:"nics"`
	GPUs []GPUAlignment `json:"gpus"`
}

// podChecks runs the pod checks for the netns at nsPath, pid, when
// non-zero, the only process checked, gpus the PCI addresses of GPUs the
// pod holds besides those its processes can open: it adds their findings
// to fs and returns what it saw of the pod.
func podChecks(e *Env, fs *Findings, nsPath string, pid int, gpus []string) *PodView {
	p := &PodView{Netns: nsPath, Devices: []Device{}, VerbsNodes: []string{}, Rails: []Rail{}, Processes: []Process{},
		NICs: []NIC{}, GPUs: []GPUAlignment{}}
	id, err := e.NetnsOf(nsPath)
	if err != nil {
		fs.add(Fail, "netns", nsPath, fmt.Sprintf("cannot open the network namespace: %v", err),
			"pass a netns path (/run/netns/NAME, /proc/PID/ns/net) or --pid of a process in the pod; run as root")
		return p
	}
	p.Inode = id.Ino

	mode, modeErr := e.Kernel.NetnsMode()
	p.NetnsMode = mode
	switch {
	case modeErr != nil:
		// Say it as the node view does, then still check the processes:
		// their limits matter once RDMA is there.
		modeFindings(fs, e.Kernel)
	case mode != rdmans.ModeExclusive:
		modeFindings(fs, e.Kernel)
	}

	if modeErr == nil {
		podDevices(fs, e, p)
		p.VerbsNodes = verbsNodes(e, p)
		podRails(fs, e, p)
	}

	var pids []int
	if pid != 0 {
		pids = []int{pid}
	} else {
		pids = e.Proc.InNetns(id)
	}
	for _, pid := range pids {
		p.Processes = append(p.Processes, e.Proc.Inspect(pid))
	}
	processFindings(fs, p)
	p.GPUs = alignFindings(fs, podGPUs(e.Proc.Root, e.SysfsRoot, e.Proc, pids, gpus), p.NICs)
	if pid != 0 {
		nriPidFindings(fs, e, pid)
	}
	return p
}

func podDevices(fs *Findings, e *Env, p *PodView) {
	names, err := e.Kernel.DevicesIn(p.Netns)
	if err != nil {
		fs.add(Fail, "devices", p.Netns, fmt.Sprintf("cannot list the RDMA devices in the netns: %v", err), "run the doctor as root")
		return
	}
	if len(names) == 0 {
		fs.add(Fail, "devices", p.Netns, "no RDMA device is in this network namespace: verbs applications in the pod find no device (NCCL: \"NET/IB : No device found\")",
			"check that the pod's network chain ends with rdma-netns after host-device/sriov, and run `rdma-netns doctor` for the node view: it shows where each device is")
		return
	}
	var devs []Device
	if err := e.SysfsIn(p.Netns, func(root string) error {
		d, err := readDevices(root, e.DevRoot, names)
		devs = d
		if err == nil {
			p.NICs = readNICs(root, d)
		}
		return err
	}); err != nil {
		fs.add(Warn, "sysfs", p.Netns, fmt.Sprintf("cannot read the details of %s from a sysfs of the netns: %v", strings.Join(names, ", "), err),
			"run the doctor as root (it mounts a private sysfs inside the netns)")
		devs = namesOnly(names)
	}
	for i := range devs {
		devs[i].Location = Location{Netns: p.Netns, Inode: p.Inode, Shared: p.NetnsMode == rdmans.ModeShared}
		podDeviceFindings(fs, devs[i])
	}
	p.Devices = devs
}

// podRails runs the rails check on the ports of the pod's devices, inside
// the pod's netns.
func podRails(fs *Findings, e *Env, p *PodView) {
	devs := railDevs(p.Devices)
	if len(devs) == 0 || e.NetIn == nil {
		return
	}
	if err := e.NetIn(p.Netns, func(n RailNet) error {
		p.Rails = checkRails(fs, n, devs, p.Netns)
		return nil
	}); err != nil {
		fs.add(Warn, "rails", p.Netns, fmt.Sprintf("cannot read the addresses, ARP settings and routes of the pod's RDMA netdevs: %v", err), "run the doctor as root")
	}
}

func processFindings(fs *Findings, p *PodView) {
	if len(p.Processes) == 0 {
		fs.add(OK, "processes", p.Netns, "no process runs in this netns yet, so limits, /dev/shm and device access were not checked", "")
		return
	}
	for _, pr := range p.Processes {
		subj := fmt.Sprintf("pid %d (%s)", pr.PID, pr.Comm)
		if pr.Ignored {
			fs.add(OK, "process", subj, "the sandbox's pause process; not checked", "")
			continue
		}
		lacks, hasNodes := needsFindings(fs, subj, pr, p.VerbsNodes)
		if hasNodes {
			accessFinding(fs, subj, pr, p.VerbsNodes)
		}
		ucxFinding(fs, subj, pr, p.Devices)
		if len(p.Devices) > 0 {
			nriLacksFinding(fs, subj, lacks)
		}
	}
}

// verbsNodes are the nodes the pod's processes need: the kernel, asked
// inside the pod's netns, names the uverbs node of each device (sysfs's
// infiniband_verbs class is not filtered by netns); a kernel too old to
// answer leaves the uverbs and rdma_cm nodes sysfs pairs with the devices.
func verbsNodes(e *Env, p *PodView) []string {
	want := []string{}
	if len(p.Devices) == 0 {
		return want
	}
	if v, err := e.Kernel.VerbsNodesIn(p.Netns); err == nil {
		for _, d := range v.Devices {
			if d.Uverbs != nil {
				want = append(want, d.Uverbs.Name)
			}
		}
		if v.RdmaCM != nil {
			want = append(want, v.RdmaCM.Name)
		}
		sort.Strings(want)
		return want
	}
	for _, c := range podCharDevices(p) {
		if strings.HasPrefix(c, "uverbs") || c == "rdma_cm" {
			want = append(want, c)
		}
	}
	return want
}

// podCharDevices are the /dev/infiniband names of the pod's RDMA devices,
// which its processes should be able to open.
func podCharDevices(p *PodView) []string {
	var want []string
	for _, d := range p.Devices {
		for _, c := range d.CharDevices {
			b := filepath.Base(c)
			if !slices.Contains(want, b) {
				want = append(want, b)
			}
		}
	}
	sort.Strings(want)
	return want
}

// sections are the pod view in the text report.
func (p *PodView) sections() []section {
	s := []section{
		{heading: fmt.Sprintf("Pod network namespace %s (inode %d)", p.Netns, p.Inode)},
		devicesSection("RDMA devices in it", p.Devices, false),
	}
	if len(p.Rails) > 0 {
		s = append(s, railsSection(p.Rails))
	}
	if len(p.GPUs) > 0 {
		s = append(s, alignSection(p.GPUs, p.NICs))
	}
	procs := section{heading: "Processes in it", none: "none",
		header: []string{"PID", "COMMAND", "MEMLOCK (soft)", "CAP_IPC_LOCK", "/dev/shm", "/dev/infiniband"}}
	for _, pr := range p.Processes {
		ipc := "no"
		if pr.CapIPCLock {
			ipc = "yes"
		}
		procs.rows = append(procs.rows, []string{fmt.Sprint(pr.PID), pr.Comm, pr.Memlock.String(), ipc, pr.ShmString(), charSummary(pr.CharDevices, p.VerbsNodes)})
	}
	return append(s, procs)
}

// railsSection shows one line per address of each rail: its RoCE v2 GID,
// the ARP settings the kernel applies, and for rails sharing a subnet the
// netdev the route to a peer leaves by.
func railsSection(rails []Rail) section {
	s := section{heading: "Rails",
		header: []string{"DEVICE", "PORT", "NETDEV", "ADDRESS", "ROCE V2 GID", "ARP IGNORE/ANNOUNCE", "SHARES SUBNET WITH", "ROUTE TO PEER"}}
	for _, rl := range rails {
		arp := fmt.Sprintf("%s/%s", arpValue(rl.ArpIgnore), arpValue(rl.ArpAnnounce))
		shares := dash(strings.Join(rl.SharesSubnetWith, ","))
		addrs := rl.Addresses
		if len(addrs) == 0 {
			addrs = []RailAddress{{}}
		}
		for i, a := range addrs {
			dev, port, nd := rl.Device, fmt.Sprint(rl.Port), rl.Netdev
			if i > 0 {
				dev, port, nd = "", "", ""
			}
			gid := "-"
			if a.RoCEv2GID != nil {
				gid = fmt.Sprint(*a.RoCEv2GID)
			} else if a.Address != "" {
				gid = "none"
			}
			route := "-"
			switch {
			case a.RouteNetdev != "":
				route = a.Peer + " dev " + a.RouteNetdev
			case a.RouteError != "":
				route = a.Peer + " error"
			}
			s.rows = append(s.rows, []string{dev, port, nd, dash(a.Address), gid, arp, shares, route})
		}
	}
	return s
}

func arpValue(v int) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprint(v)
}

// charSummary shows the character devices of the pod's RDMA devices that a
// process has, and how many others it sees besides.
func charSummary(have, want []string) string {
	if len(want) == 0 {
		return dash(strings.Join(have, " "))
	}
	var shown []string
	for _, h := range have {
		if slices.Contains(want, h) {
			shown = append(shown, h)
		}
	}
	s := dash(strings.Join(shown, " "))
	if others := len(have) - len(shown); others > 0 {
		s += fmt.Sprintf(" (+%d others)", others)
	}
	return s
}
