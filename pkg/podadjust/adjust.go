package podadjust

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// Kernel is what the adjustment asks the running kernel.
type Kernel interface {
	// NetnsMode is the RDMA subsystem's netns mode (rdmans.ModeExclusive
	// or rdmans.ModeShared).
	NetnsMode() (string, error)
	// VerbsNodesIn lists the RDMA devices of the netns at nsPath with
	// their uverbs nodes, and rdma_cm.
	VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error)
}

// Shm measures and resizes the tmpfs a pod's containers share as /dev/shm.
type Shm interface {
	// Size is the size of the tmpfs mounted at path (Unlimited if it has
	// no size limit), an error if path is not the root of a tmpfs mount.
	Size(path string) (uint64, error)
	// Resize changes the size of the tmpfs mounted at path.
	Resize(path string, bytes uint64) error
}

// Adjuster computes container adjustments.
type Adjuster struct {
	Policy Policy
	Kernel Kernel
	Shm    Shm
	// SameAsSelf reports whether nsPath is the host's netns (the
	// plugin's own): a pod in the host network namespace sees every host
	// RDMA device and must get none of them. An error (it cannot tell)
	// grants nothing either. nil: never.
	SameAsSelf func(nsPath string) (bool, error)
	// Visible reports whether the plugin can open nsPath; the pod's netns
	// is then found through its pid instead. nil: always.
	Visible func(nsPath string) bool
}

// Outcome is what Adjust did with a container, as a value the plugin
// chooses its log level from.
type Outcome int

// The outcomes. Every one but Adjusted leaves the container as the
// runtime made it.
const (
	// Adjusted: the pod holds RDMA devices; the container gets them.
	Adjusted Outcome = iota
	// OptedOut: the pod carries rdma-netns.io/nri: skip.
	OptedOut
	// HostNetwork: the pod has no network namespace of its own.
	HostNetwork
	// NotExclusive: the RDMA subsystem is not known to be in exclusive
	// netns mode (shared, or the mode cannot be read), so no netns can be
	// shown to hold a device of its own: in shared mode every netns sees
	// every device of the node.
	NotExclusive
	// NetnsUnknown: the pod's network namespace cannot be opened or read.
	NetnsUnknown
	// NoDevice: the pod's network namespace holds no RDMA device.
	NoDevice
	// Refused: the pod holds RDMA devices but asks for more than the node
	// allows (a /dev/shm above Policy.MaxShmSize). The plugin fails the
	// container's creation with the reason, which the pod's events show.
	Refused
)

// Decision says what Adjust did to one container and why, for the log.
type Decision struct {
	Outcome Outcome
	// Reason says why a container was left alone ("" if adjusted).
	Reason string
	Netns  string
	// Devices are the pod's RDMA devices; Nodes the device nodes added,
	// Kept those the container already had.
	Devices []string
	Nodes   []string
	Kept    []string
	Memlock string
	Shm     string
	// Warnings are what could not be given, and why.
	Warnings []string
}

func (d Decision) String() string {
	switch d.Outcome {
	case Adjusted:
	case Refused:
		return "refused: " + d.Reason
	default:
		return "not adjusted: " + d.Reason
	}
	s := fmt.Sprintf("pod netns %s holds %s: devices %s", d.Netns, strings.Join(d.Devices, ","), strings.Join(d.Nodes, " "))
	if len(d.Kept) > 0 {
		s += fmt.Sprintf(" (had %s already)", strings.Join(d.Kept, " "))
	}
	s += fmt.Sprintf(", memlock %s, /dev/shm %s", d.Memlock, d.Shm)
	if len(d.Warnings) > 0 {
		s += "; " + strings.Join(d.Warnings, "; ")
	}
	return s
}

func (d *Decision) skip(o Outcome, reason string) {
	d.Outcome, d.Reason = o, reason
}

// Adjust decides the adjustment of a container being created in pod.
// A nil adjustment means the container is left as the runtime made it.
// Only a pod that asks for more than the node allows is refused (outcome
// Refused, the reason for the pod's events); what Adjust cannot find out
// or do is in the decision, and `rdma-netns doctor --pid` tells the rest.
func (a *Adjuster) Adjust(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Decision) {
	nodes, d := a.Nodes(pod)
	if nodes == nil {
		return nil, d
	}
	shm, err := a.shmWanted(pod, &d)
	if err != nil {
		d.skip(Refused, err.Error())
		return nil, d
	}
	adj := &api.ContainerAdjustment{}
	a.addDevices(adj, ctr, nodes, &d)
	a.setMemlock(adj, ctr, &d)
	d.Shm = a.sizeShm(pod, ctr, shm, &d)
	return adj, d
}

// Nodes asks the kernel, inside the pod's netns, for the pod's RDMA
// devices with their uverbs nodes, and rdma_cm. It returns nil, with the
// reason in the decision, for a pod whose containers are left alone: it
// opts out, runs in the host's network namespace, the node is not in
// exclusive mode, its netns cannot be read, or it holds no RDMA device.
func (a *Adjuster) Nodes(pod *api.PodSandbox) (*rdmans.VerbsNodes, Decision) {
	var d Decision
	if v := pod.GetAnnotations()[AnnotationNRI]; v == Skip {
		d.skip(OptedOut, fmt.Sprintf("the pod opts out (%s: %s)", AnnotationNRI, Skip))
		return nil, d
	}
	if reason := a.NotExclusive(); reason != "" {
		d.skip(NotExclusive, reason)
		return nil, d
	}
	path, own := netnsOf(pod)
	if !own {
		d.skip(HostNetwork, "the pod has no network namespace of its own (host network)")
		return nil, d
	}
	if d.Netns = a.netnsPath(pod, path); d.Netns == "" {
		d.skip(NetnsUnknown, fmt.Sprintf("cannot find the pod's network namespace: %s, and the runtime gave no pod pid", missing(path)))
		return nil, d
	}
	if a.SameAsSelf != nil {
		host, err := a.SameAsSelf(d.Netns)
		if err != nil {
			d.skip(NetnsUnknown, fmt.Sprintf("cannot tell whether the pod's network namespace %s is the host's: %v", d.Netns, err))
			return nil, d
		}
		if host {
			d.skip(HostNetwork, fmt.Sprintf("the pod's network namespace (%s) is the host's", d.Netns))
			return nil, d
		}
	}
	nodes, err := a.Kernel.VerbsNodesIn(d.Netns)
	if err != nil {
		d.skip(NetnsUnknown, fmt.Sprintf("cannot read the RDMA devices of the pod's netns: %v", err))
		return nil, d
	}
	if len(nodes.Devices) == 0 {
		d.skip(NoDevice, "no RDMA device in the pod's network namespace "+d.Netns)
		return nil, d
	}
	return nodes, d
}

// NotExclusive says why the kernel's RDMA netns mode forbids giving any
// pod a device, "" when it is exclusive. "This netns holds that device"
// proves the pod owns it only in exclusive mode: in shared mode every
// netns sees every device of the node, so the pod of a plain network
// would get them all. A mode that cannot be read grants nothing either.
func (a *Adjuster) NotExclusive() string {
	mode, err := a.Kernel.NetnsMode()
	switch {
	case err != nil:
		return fmt.Sprintf("cannot read the RDMA netns mode (%v), so no pod can be shown to own a device; %s", err, ExclusiveFix)
	case mode != rdmans.ModeExclusive:
		return fmt.Sprintf("the RDMA subsystem is in %s netns mode, where every pod sees every RDMA device of the node; %s", mode, ExclusiveFix)
	}
	return ""
}

// ExclusiveFix is what the operator does about a node not in exclusive
// mode (README, "Prepare the nodes").
const ExclusiveFix = "no container is adjusted until the node runs in exclusive mode: set it at boot " +
	"(options ib_core netns_mode=0 in /etc/modprobe.d, then reboot; README step 1)"

// netnsOf is the path of the pod's network namespace; own is false if the
// pod runs in the host's (no network entry). An entry with an empty path
// is a namespace of its own that the runtime creates without a path.
func netnsOf(pod *api.PodSandbox) (path string, own bool) {
	for _, ns := range pod.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			return ns.GetPath(), true
		}
	}
	return "", false
}

// netnsPath is where the plugin opens the pod's network namespace: the
// runtime's path, or, when the runtime gave none or the plugin cannot see
// it (the runtime keeps it in a directory the plugin's mount namespace
// lacks), /proc/<pod pid>/ns/net (the DaemonSet has hostPID). "" when
// neither is there. Whatever it names is still checked against the
// host's netns, and the kernel's answer from inside it decides.
func (a *Adjuster) netnsPath(pod *api.PodSandbox, path string) string {
	if path != "" && (a.Visible == nil || a.Visible(path)) {
		return path
	}
	if pid := pod.GetPid(); pid != 0 {
		return fmt.Sprintf("/proc/%d/ns/net", pid)
	}
	return ""
}

// missing says why the runtime's netns path was not used.
func missing(path string) string {
	if path == "" {
		return "the runtime made it a new network namespace without a path"
	}
	return path + " is not visible to the plugin"
}

// addDevices gives the container the uverbs node of each of the pod's
// devices and rdma_cm, with the numbers the kernel reports, mode 0666 as
// rdma-core's udev rules make them on the node. The runtime adds an allow
// rule to the container's device cgroup for every device an adjustment
// adds (NRI's AdjustDevices does both), so no other node opens. A node the
// container already has (from its spec, a device plugin, or an NRI plugin
// that ran before this one) is left as it is: the runtime fails a
// container whose device two plugins set.
func (a *Adjuster) addDevices(adj *api.ContainerAdjustment, ctr *api.Container, nodes *rdmans.VerbsNodes, d *Decision) {
	has := map[string]bool{}
	for _, dev := range ctr.GetLinux().GetDevices() {
		has[filepath.Clean(dev.GetPath())] = true
	}
	add := func(c rdmans.CharDev) {
		if has[c.Path()] {
			d.Kept = append(d.Kept, c.Path())
			return
		}
		adj.AddDevice(&api.LinuxDevice{
			Path:     c.Path(),
			Type:     "c",
			Major:    int64(c.Major),
			Minor:    int64(c.Minor),
			FileMode: api.FileMode(os.FileMode(0o666)),
		})
		d.Nodes = append(d.Nodes, c.Path())
	}
	for _, v := range nodes.Devices {
		d.Devices = append(d.Devices, v.Device)
		if v.Uverbs == nil {
			d.Warnings = append(d.Warnings, fmt.Sprintf("the kernel has no uverbs node for %s (load ib_uverbs)", v.Device))
			continue
		}
		add(*v.Uverbs)
	}
	if nodes.RdmaCM == nil {
		d.Warnings = append(d.Warnings, "the kernel has no rdma_cm node (load rdma_ucm)")
		return
	}
	add(*nodes.RdmaCM)
}

// setMemlock sets the policy's memlock, unless the container already has
// at least that much (the runtime's default spec, or an NRI plugin that
// ran before this one, such as containerd's ulimit-adjuster sample): the
// runtime fails a container whose rlimit two plugins set. The soft limit
// is what verbs registration is checked against.
func (a *Adjuster) setMemlock(adj *api.ContainerAdjustment, ctr *api.Container, d *Decision) {
	d.Memlock = a.Policy.Memlock.String()
	if a.Policy.Memlock.Keep {
		return
	}
	l := a.Policy.Memlock.Limit()
	if have, ok := memlockOf(ctr); ok && have >= l {
		d.Memlock = Memlock{Unlimited: have == math.MaxUint64, Bytes: have}.String() + " already"
		return
	}
	adj.AddRlimit("RLIMIT_MEMLOCK", l, l)
}

// memlockOf is the container's memlock soft limit as the runtime would set
// it: its last RLIMIT_MEMLOCK entry (later plugins' come after).
func memlockOf(ctr *api.Container) (uint64, bool) {
	rl := ctr.GetRlimits()
	for i := len(rl) - 1; i >= 0; i-- {
		if rl[i].GetType() == "RLIMIT_MEMLOCK" {
			return rl[i].GetSoft(), true
		}
	}
	return 0, false
}

// sizeShm sets the size of the pod's /dev/shm and says what it did.
//
// How: containerd (and CRI-O) mount one tmpfs per pod sandbox, 64 MiB,
// and bind-mount it as /dev/shm into every container of the pod, which
// also share the pod's IPC namespace. The size is a property of that
// tmpfs, not of the bind mounts, so remounting it with a new size resizes
// /dev/shm for every container of the pod at once, those already running
// included, and they keep sharing it. The runtime still owns it: it goes
// away with the sandbox, so nothing is left behind if this plugin is gone
// by then. A tmpfs of our own per pod would instead need a host mount we
// create, bind into each container and must remember to remove. Its pages
// are charged to the memory cgroup of the container that writes them, so
// the pod's memory limit bounds what it really uses; the size is capped at
// that limit so as not to promise more.
//
// Only the sandbox's own tmpfs is touched: the container's /dev/shm mount
// must come from the sandbox's directory under the runtime's sandbox root
// (a hostIPC pod gets the node's /dev/shm, a pod that mounts an emptyDir
// there its own volume; both are left alone) and be the root of a tmpfs
// mount. It is only ever
// grown: shrinking a tmpfs below what is in use fails, and another
// container of the pod may have asked for more.
func (a *Adjuster) sizeShm(pod *api.PodSandbox, ctr *api.Container, shm shmRequest, d *Decision) string {
	want, why := shm.size, shm.why
	if want == 0 {
		return "kept as the runtime made it (" + why + ")"
	}
	if limit, whose := memoryLimit(pod, ctr); limit > 0 && want > limit {
		want, why = limit, whose+" memory limit"
	}
	src := shmSource(ctr)
	switch {
	case src == "":
		return "left alone: the container has no /dev/shm mount"
	case !inSandbox(src, pod.GetId(), a.Policy.SandboxRoots):
		return fmt.Sprintf("left alone: /dev/shm comes from %s, not from the pod sandbox's tmpfs under %s (hostIPC, a volume of the pod's own, or a runtime whose sandbox root --sandbox-root lacks)",
			src, strings.Join(a.Policy.SandboxRoots, ", "))
	}
	have, err := a.Shm.Size(src)
	if err != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("cannot measure the pod's /dev/shm %s: %v", src, err))
		return "unchanged"
	}
	if have >= want {
		return fmt.Sprintf("%s already (%s %s)", shmSize(have), why, FormatSize(want))
	}
	if err := a.Shm.Resize(src, want); err != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("cannot resize the pod's /dev/shm %s to %s: %v", src, FormatSize(want), err))
		return "unchanged at " + FormatSize(have)
	}
	return fmt.Sprintf("%s (%s; was %s)", FormatSize(want), why, FormatSize(have))
}

// shmRequest is the /dev/shm size a pod gets (0: the runtime's) and why.
type shmRequest struct {
	size uint64
	why  string
}

// shmWanted is the node's default size, or the pod's annotation when it
// is a size: one that cannot be read is ignored (the default applies, the
// decision warns), one above Policy.MaxShmSize is an error, for the pod's
// events. The pod's memory limit does not excuse it: the pod asked for
// more than the node allows, and it learns so now rather than from a
// smaller /dev/shm than it asked for.
func (a *Adjuster) shmWanted(pod *api.PodSandbox, d *Decision) (shmRequest, error) {
	v, ok := pod.GetAnnotations()[AnnotationShmSize]
	if !ok {
		return shmRequest{a.Policy.ShmSize, "node default"}, nil
	}
	n, err := ParseShmSize(v)
	if err != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("annotation %s ignored: %v", AnnotationShmSize, err))
		return shmRequest{a.Policy.ShmSize, "node default"}, nil
	}
	if n > a.Policy.MaxShmSize {
		limit := FormatSize(a.Policy.MaxShmSize)
		return shmRequest{}, fmt.Errorf("rdma-netns-nri: the pod's annotation %s: %s asks for more /dev/shm than this node allows (rdma-netns-nri --max-shm-size %s): "+
			"ask for %s or less, or have the cluster's operator raise the cap (Helm chart value nri.maxShmSize)",
			AnnotationShmSize, canonical(v), limit, limit)
	}
	return shmRequest{n, "annotation"}, nil
}

// canonical is a quantity that parsed, as Kubernetes writes it: short,
// whatever the pod wrote around it.
func canonical(v string) string {
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil {
		return "?"
	}
	return q.String()
}

// shmSize prints a tmpfs size.
func shmSize(n uint64) string {
	if n == Unlimited {
		return "unlimited"
	}
	return FormatSize(n)
}

// memoryLimit is the pod's memory limit when the runtime passes it (the
// sum kubelet computes for the sandbox), else the container's own, which
// is never above the pod's; 0 when neither is set.
func memoryLimit(pod *api.PodSandbox, ctr *api.Container) (uint64, string) {
	if l := pod.GetLinux().GetPodResources().GetMemory().GetLimit().GetValue(); l > 0 {
		return uint64(l), "the pod's"
	}
	if l := ctr.GetLinux().GetResources().GetMemory().GetLimit().GetValue(); l > 0 {
		return uint64(l), "the container's"
	}
	return 0, ""
}

// shmSource is where the container's /dev/shm is bind-mounted from.
func shmSource(ctr *api.Container) string {
	for _, m := range ctr.GetMounts() {
		if filepath.Clean(m.GetDestination()) == "/dev/shm" {
			return m.GetSource()
		}
	}
	return ""
}

// inSandbox: path is in the directory of sandbox id under one of the
// runtime's sandbox roots (containerd: <root>/ID/shm, CRI-O:
// <root>/ID/userdata/shm).
func inSandbox(path, id string, roots []string) bool {
	path = filepath.Clean(path)
	for _, root := range roots {
		rest, ok := strings.CutPrefix(path, filepath.Clean(root)+"/")
		if first, _, _ := strings.Cut(rest, "/"); ok && id != "" && first == id {
			return true
		}
	}
	return false
}
