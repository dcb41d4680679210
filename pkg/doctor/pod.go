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
}

// The fixes of the pod checks. With NRI (containerd >= 1.7, on by default
// in 2.x; CRI-O with enable_nri) rdma-netns-nri gives every container of
// a pod holding RDMA devices all three when the container is created;
// without it, the pod spec asks for each (conf/pod-nccl-by-hand.yaml).
const (
	nriFix        = "run rdma-netns-nri on the node (conf/daemonset.yaml, container nri) and recreate the pod: NRI changes containers only when they are created"
	memlockRemedy = nriFix + " (it sets memlock unlimited); or by hand: give the container the IPC_LOCK capability (securityContext.capabilities.add: [\"IPC_LOCK\"]), " +
		"or raise its memlock limit: set the runtime's default ulimits (containerd: LimitMEMLOCK=infinity in its systemd unit; CRI-O: default_ulimits = [\"memlock=-1:-1\"]; docker: --ulimit memlock=-1)"
	shmRemedy = nriFix + " (it grows the pod's /dev/shm, rdma-netns.io/shm-size: 16Gi to choose, up to the node's --max-shm-size, 16Gi by default); or by hand: mount a memory-backed emptyDir on /dev/shm (volumes: emptyDir: {medium: Memory, sizeLimit: 16Gi}), or docker --shm-size=16g; " +
		"NCCL_SHM_DISABLE=1 avoids /dev/shm for NCCL at some speed cost, as a last resort"
	charRemedy = nriFix + " (it adds exactly the pod's uverbs nodes and rdma_cm); or by hand: let an RDMA device plugin (k8s-rdma-shared-dev-plugin, sriov-network-device-plugin) inject /dev/infiniband for the pod's resource, or run the container privileged"
)

// Pod runs the pod checks for the netns at nsPath; pid, when non-zero,
// limits the process checks to that process.
func Pod(e *Env, nsPath string, pid int) *Report {
	r := &Report{}
	p := &PodView{Netns: nsPath, Devices: []Device{}, VerbsNodes: []string{}, Rails: []Rail{}, Processes: []Process{}}
	r.Pod = p
	id, err := e.NetnsOf(nsPath)
	if err != nil {
		r.add(Fail, "netns", nsPath, fmt.Sprintf("cannot open the network namespace: %v", err),
			"pass a netns path (/run/netns/NAME, /proc/PID/ns/net) or --pid of a process in the pod; run as root")
		r.finish()
		return r
	}
	p.Inode = id.Ino

	mode, modeErr := e.Kernel.NetnsMode()
	p.NetnsMode = mode
	switch {
	case modeErr != nil:
		// Say it as the node view does, then still check the processes:
		// their limits matter once RDMA is there.
		modeFindings(r, e.Kernel)
	case mode != rdmans.ModeExclusive:
		modeFindings(r, e.Kernel)
	}

	if modeErr == nil {
		podDevices(r, e, p)
		p.VerbsNodes = verbsNodes(e, p)
		podRails(r, e, p)
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
	processFindings(r, p)
	if pid != 0 {
		nriPidFindings(r, e, pid)
	}
	r.finish()
	return r
}

func podDevices(r *Report, e *Env, p *PodView) {
	names, err := e.Kernel.DevicesIn(p.Netns)
	if err != nil {
		r.add(Fail, "devices", p.Netns, fmt.Sprintf("cannot list the RDMA devices in the netns: %v", err), "run the doctor as root")
		return
	}
	if len(names) == 0 {
		r.add(Fail, "devices", p.Netns, "no RDMA device is in this network namespace: verbs applications in the pod find no device (NCCL: \"NET/IB : No device found\")",
			"check that the pod's network chain ends with rdma-netns after host-device/sriov, and run `rdma-netns doctor` for the node view: it shows where each device is")
		return
	}
	var devs []Device
	if err := e.SysfsIn(p.Netns, func(root string) error {
		d, err := readDevices(root, e.DevRoot, names)
		devs = d
		return err
	}); err != nil {
		r.add(Warn, "sysfs", p.Netns, fmt.Sprintf("cannot read the details of %s from a sysfs of the netns: %v", strings.Join(names, ", "), err),
			"run the doctor as root (it mounts a private sysfs inside the netns)")
		devs = namesOnly(names)
	}
	for i := range devs {
		devs[i].Location = Location{Netns: p.Netns, Inode: p.Inode, Shared: p.NetnsMode == rdmans.ModeShared}
		d := devs[i]
		before := len(r.Findings)
		for _, port := range d.Ports {
			subj := fmt.Sprintf("%s port %d", d.Name, port.Port)
			switch {
			case port.GIDs == 0:
				r.add(Fail, "gids", subj, "the port's GID table is empty: RoCE traffic and rdma_cm cannot address it (NCCL fails to find a GID)",
					"bring the pod's netdev up and give it an IP address (the IPAM of the chain); a GID entry appears for each address")
			case len(port.Netdevs) == 0 && port.LinkLayer == "Ethernet":
				r.add(Warn, "netdev", subj, "no netdev is associated with this RoCE port", "check that the pod's netdev belongs to this device (rdma link)")
			case len(port.NetdevsElsewhere) > 0:
				r.add(Warn, "netdev", subj, fmt.Sprintf("its netdev %s is not in this netns", strings.Join(port.NetdevsElsewhere, ",")),
					"rdma-netns moves the RDMA device with the netdev; recreate the pod")
			}
			if port.State != "" && port.State != "ACTIVE" {
				r.add(Warn, "port-state", subj, fmt.Sprintf("port state is %s (physical %s), not ACTIVE", port.State, dash(port.PhysState)),
					"check the link and that the pod's netdev is up")
			}
		}
		if len(r.Findings) == before {
			r.add(OK, "device", d.Name, deviceSummary(d), "")
		}
	}
	p.Devices = devs
}

// podRails runs the rails check on the ports of the pod's devices, inside
// the pod's netns.
func podRails(r *Report, e *Env, p *PodView) {
	devs := railDevs(p.Devices)
	if len(devs) == 0 || e.NetIn == nil {
		return
	}
	if err := e.NetIn(p.Netns, func(n RailNet) error {
		p.Rails = checkRails(r, n, devs, p.Netns)
		return nil
	}); err != nil {
		r.add(Warn, "rails", p.Netns, fmt.Sprintf("cannot read the addresses, ARP settings and routes of the pod's RDMA netdevs: %v", err), "run the doctor as root")
	}
}

func processFindings(r *Report, p *PodView) {
	if len(p.Processes) == 0 {
		r.add(OK, "processes", p.Netns, "no process runs in this netns yet, so limits, /dev/shm and device access were not checked", "")
		return
	}
	want := p.VerbsNodes
	for _, pr := range p.Processes {
		subj := fmt.Sprintf("pid %d (%s)", pr.PID, pr.Comm)
		if pr.Ignored {
			r.add(OK, "process", subj, "the sandbox's pause process; not checked", "")
			continue
		}
		var lacks []string
		if memlockFinding(r, subj, pr) != OK {
			lacks = append(lacks, "a memlock limit for memory registration")
		}
		if shmFinding(r, subj, pr) != OK {
			lacks = append(lacks, "a /dev/shm of a useful size")
		}
		var missing []string
		for _, w := range want {
			if !slices.Contains(pr.CharDevices, w) {
				missing = append(missing, "/dev/infiniband/"+w)
			}
		}
		switch {
		case len(missing) > 0:
			// Without its uverbs node no verbs application can start.
			r.add(Fail, "char-devices", subj, fmt.Sprintf("cannot open %s: the container's /dev lacks them, so verbs (ibv_open_device) or rdma_cm fail", strings.Join(missing, " ")),
				charRemedy)
			lacks = append([]string{"the device nodes " + strings.Join(missing, " ")}, lacks...)
		case len(want) > 0:
			r.add(OK, "char-devices", subj, "sees "+strings.Join(want, " ")+" under /dev/infiniband", "")
			// Having them is not opening them: not the NRI plugin's to
			// give (its nodes are 0666), so not among lacks.
			accessFinding(r, subj, pr, want)
		}
		ucxFinding(r, subj, pr, p.Devices)
		if len(p.Devices) > 0 && len(lacks) > 0 {
			// The three come together from the NRI plugin: one missing
			// alone is a pod setting, all of them the plugin not running.
			r.add(Warn, "nri", subj, fmt.Sprintf("lacks %d of the 3 things rdma-netns-nri gives each container of a pod holding RDMA devices: %s", len(lacks), strings.Join(lacks, "; ")),
				nriFix+"; the findings above give the by-hand fix of each")
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

// MemlockVerdict decides whether RDMA memory registration can work.
func MemlockVerdict(pr Process) (Severity, string) {
	switch {
	case !pr.Memlock.Known:
		return Warn, "cannot read its memlock limit"
	case pr.CapIPCLock:
		return OK, fmt.Sprintf("holds CAP_IPC_LOCK, so memory registration ignores its memlock limit (%s)", pr.Memlock)
	case pr.Memlock.Sufficient(MinMemlock):
		return OK, fmt.Sprintf("memlock limit %s is enough for RDMA memory registration", pr.Memlock)
	}
	// NCCL and MPI register far more than this per connection: this is
	// a certain failure, not a risk.
	return Fail, fmt.Sprintf("memlock limit %s (below %s) and no CAP_IPC_LOCK: RDMA memory registration will fail (NCCL: \"ibv_reg_mr failed\", \"Cannot allocate memory\")",
		pr.Memlock, FormatBytes(MinMemlock))
}

func memlockFinding(r *Report, subj string, pr Process) Severity {
	sev, reason := MemlockVerdict(pr)
	remedy := ""
	if sev != OK {
		remedy = memlockRemedy
	}
	r.add(sev, "memlock", subj, reason, remedy)
	return sev
}

// ShmVerdict grades the size of /dev/shm.
func ShmVerdict(pr Process) (Severity, string) {
	switch {
	case pr.ShmErr != "":
		return Warn, "no usable /dev/shm: " + pr.ShmErr
	case pr.ShmBytes < MinShm:
		// Only workloads that pass data between processes through
		// /dev/shm (several GPUs per pod, DataLoader workers) hit this.
		return Warn, fmt.Sprintf("/dev/shm is only %s (below %s): NCCL between GPUs of this pod can fail with \"posix_fallocate failed: No space left on device\", PyTorch DataLoader workers with \"Bus error\"",
			FormatBytes(pr.ShmBytes), FormatBytes(MinShm))
	}
	return OK, fmt.Sprintf("/dev/shm is %s", FormatBytes(pr.ShmBytes))
}

func shmFinding(r *Report, subj string, pr Process) Severity {
	sev, reason := ShmVerdict(pr)
	remedy := ""
	if sev != OK {
		remedy = shmRemedy
	}
	r.add(sev, "shm", subj, reason, remedy)
	return sev
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
