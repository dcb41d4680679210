package doctor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// What the doctor knows of rdma-netns-nri without linking it (the CNI
// binary links no NRI code): where the runtime finds pre-installed
// plugins, the lock the running instance holds, and the annotations it
// puts on the containers it adjusts (nriplugin.AnnotationAdjustedBy and
// AnnotationWarnings; TestDoctorKnowsThePlugin in
// pkg/nriplugin/launched_test.go checks they match, and the lock).
const (
	NRIAdjustedBy = "rdma-netns.io/nri-adjusted-by"
	NRIWarnings   = "rdma-netns.io/nri-warnings"
	// containerd's CRI annotations in a container's OCI spec.
	criContainerType = "io.kubernetes.cri.container-type"
	criContainerName = "io.kubernetes.cri.container-name"
	criPodName       = "io.kubernetes.cri.sandbox-name"
	criPodNamespace  = "io.kubernetes.cri.sandbox-namespace"
)

// nriNames are the plugin's file names: the binary, and the copy the
// runtime launches from its plugin directory (NN-rdma-netns-nri). Compiled
// on first use: the CNI binary links this package, and every ADD and DEL
// would compile it at start-up.
var nriNames = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]{2}-)?rdma-netns-nri$`) })

// NRIView is what the doctor found of the NRI plugin on the node.
type NRIView struct {
	// Preinstalled are copies in the runtime's NRI plugin directory.
	Preinstalled []string `json:"preinstalled"`
	// Running are the plugin's processes, "PID ARGV0".
	Running []string `json:"running"`
	// Serving is who holds the plugin's lock, as it wrote in the file.
	Serving string `json:"serving,omitempty"`
	// Containers are the containers of pods holding RDMA devices, with
	// the instance that adjusted each ("" for none).
	Containers []NRIContainer `json:"containers"`
}

// NRIContainer is a running container of a pod holding RDMA devices.
type NRIContainer struct {
	Name       string `json:"name"` // namespace/pod/container
	ID         string `json:"id"`
	AdjustedBy string `json:"adjustedBy"`
	// Lacks are the pod's device nodes its spec lacks.
	Lacks []string `json:"lacks,omitempty"`
}

// ociSpec is what the doctor reads of a container's OCI spec.
type ociSpec struct {
	Annotations map[string]string `json:"annotations"`
	Linux       struct {
		Namespaces []struct{ Type, Path string } `json:"namespaces"`
		Devices    []struct{ Path string }       `json:"devices"`
	} `json:"linux"`
}

// nriFindings: a FAIL when the plugin runs (or is pre-installed) on a
// node in shared mode, where it gives nothing to anyone; in exclusive
// mode, a warning for each container of a pod holding RDMA devices that
// the plugin did not adjust (created while it was not serving) and lacks
// the pod's device nodes.
func nriFindings(fs *Findings, e *Env, mode string) *NRIView {
	v := &NRIView{Preinstalled: []string{}, Running: []string{}, Containers: []NRIContainer{}}
	if des, err := os.ReadDir(e.NRIPluginDir); err == nil {
		for _, de := range des {
			if strings.Contains(de.Name(), "-") && nriNames().MatchString(de.Name()) {
				v.Preinstalled = append(v.Preinstalled, filepath.Join(e.NRIPluginDir, de.Name()))
			}
		}
	}
	v.Running = nriProcesses(e.Proc.Root)
	if data, err := os.ReadFile(e.NRILock); err == nil {
		v.Serving = strings.TrimSpace(string(data))
	}
	if len(v.Preinstalled) == 0 && len(v.Running) == 0 {
		return v
	}
	where := strings.Join(append(append([]string{}, v.Preinstalled...), v.Running...), ", ")
	if mode != rdmans.ModeExclusive {
		fs.add(Fail, "nri-plugin", "node", fmt.Sprintf("rdma-netns-nri is on this node (%s) but the RDMA subsystem is in %s mode: every network namespace sees every RDMA device, "+
			"so no pod can be shown to own one and the plugin gives no container device nodes, memlock or /dev/shm", where, mode),
			"set exclusive mode at boot (options ib_core netns_mode=0, reboot) for the plugin to serve RDMA pods, or remove it from this node (the DaemonSet's nri container and /opt/nri/plugins/NN-rdma-netns-nri)")
		return v
	}
	v.Containers = nriContainers(e)
	adjusted := 0
	for _, c := range v.Containers {
		switch {
		case c.AdjustedBy != "":
			adjusted++
		case len(c.Lacks) > 0:
			fs.add(Warn, "nri-missed", c.Name, fmt.Sprintf("container %s of a pod holding RDMA devices was created while rdma-netns-nri was not serving: it runs without %s (and the plugin's memlock); NRI cannot change a running container",
				shortID(c.ID), strings.Join(c.Lacks, " ")),
				"delete the pod so that it is re-created with them (unless it opts out with rdma-netns.io/nri: skip); `rdma-netns doctor --pid PID` says what one of its processes lacks")
		}
	}
	serving := "no instance holds its lock " + e.NRILock
	if v.Serving != "" {
		serving = "serving: " + v.Serving
	}
	fs.add(OK, "nri-plugin", "node", fmt.Sprintf("rdma-netns-nri on this node (%s; %s); %d of %d containers of pods holding RDMA devices adjusted by it", where, serving, adjusted, len(v.Containers)), "")
	return v
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// nriProcesses lists the plugin's processes from /proc (the node's, with
// hostPID): the DaemonSet's container and the runtime-launched copy.
func nriProcesses(procRoot string) []string {
	des, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(procRoot, de.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(data), "\x00")
		if nriNames().MatchString(filepath.Base(argv0)) {
			out = append(out, fmt.Sprintf("pid %d %s", pid, argv0))
		}
	}
	return out
}

// nriContainers reads the OCI spec (config.json) of each running
// container of the runtime's Kubernetes namespace and keeps those of
// pods holding RDMA devices. A container in the doctor's own netns, the
// node's, is left out: its pod has host network (the DaemonSet's does),
// sees every device of the host without holding any, and the plugin
// grants such a pod nothing by design.
func nriContainers(e *Env) []NRIContainer {
	bundles, _ := filepath.Glob(filepath.Join(e.TaskDir, "*", "config.json"))
	host, hostErr := e.NetnsOf(filepath.Join(e.Proc.Root, "self", "ns", "net"))
	out := []NRIContainer{}
	for _, b := range bundles {
		spec, err := readSpec(b)
		if err != nil || spec.Annotations[criContainerType] != "container" {
			continue
		}
		netns := ""
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == "network" {
				netns = ns.Path
			}
		}
		if netns == "" {
			continue // host network
		}
		if id, err := e.NetnsOf(netns); hostErr == nil && err == nil && id == host {
			continue // host network, through the sandbox's /proc/PID/ns/net
		}
		nodes, err := e.Kernel.VerbsNodesIn(netns)
		if err != nil || len(nodes.Devices) == 0 {
			continue
		}
		c := NRIContainer{
			Name:       spec.Annotations[criPodNamespace] + "/" + spec.Annotations[criPodName] + "/" + spec.Annotations[criContainerName],
			ID:         filepath.Base(filepath.Dir(b)),
			AdjustedBy: spec.Annotations[NRIAdjustedBy],
		}
		has := map[string]bool{}
		for _, d := range spec.Linux.Devices {
			has[d.Path] = true
		}
		for _, d := range nodes.Devices {
			if d.Uverbs != nil && !has[d.Uverbs.Path()] {
				c.Lacks = append(c.Lacks, d.Uverbs.Path())
			}
		}
		if nodes.RdmaCM != nil && !has[nodes.RdmaCM.Path()] {
			c.Lacks = append(c.Lacks, nodes.RdmaCM.Path())
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func readSpec(path string) (*ociSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s ociSpec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return &s, nil
}

// containerOf finds the OCI spec of the container that process pid runs
// in: the bundle whose init process shares pid's mount namespace.
func containerOf(e *Env, pid int) (*ociSpec, string) {
	mnt, err := os.Readlink(filepath.Join(e.Proc.Root, strconv.Itoa(pid), "ns", "mnt"))
	if err != nil {
		return nil, ""
	}
	pids, _ := filepath.Glob(filepath.Join(e.TaskDir, "*", "init.pid"))
	for _, f := range pids {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		other, err := os.Readlink(filepath.Join(e.Proc.Root, strings.TrimSpace(string(data)), "ns", "mnt"))
		if err != nil || other != mnt {
			continue
		}
		spec, err := readSpec(filepath.Join(filepath.Dir(f), "config.json"))
		if err != nil {
			return nil, ""
		}
		return spec, filepath.Base(filepath.Dir(f))
	}
	return nil, ""
}

// nriPidFindings: for `doctor --pid`, what the plugin wrote on the
// process's container: who adjusted it, and what it could not give (a
// bad rdma-netns.io/shm-size, say). The doctor does not parse the pod's
// annotations itself: the plugin's verdict is the one that counted.
func nriPidFindings(fs *Findings, e *Env, pid int) {
	spec, id := containerOf(e, pid)
	if spec == nil {
		return
	}
	subj := fmt.Sprintf("pid %d (container %s)", pid, shortID(id))
	if by := spec.Annotations[NRIAdjustedBy]; by != "" {
		fs.add(OK, "nri-adjusted", subj, "adjusted at its creation by rdma-netns-nri "+by, "")
	}
	if w := spec.Annotations[NRIWarnings]; w != "" {
		fs.add(Warn, "nri-warnings", subj, "rdma-netns-nri could not give the container everything: "+w,
			"fix what it names (rdma-netns.io/shm-size takes a Kubernetes quantity: 16Gi, 2G, keep) and re-create the pod")
	}
}
