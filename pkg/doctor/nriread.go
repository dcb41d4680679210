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

// readNRI finds the plugin on the node: the copies pre-installed in the
// runtime's NRI plugin directory, its running processes ("pid PID
// ARGV0"), and who holds its lock, as the holder wrote in the lock file.
func readNRI(e *Env) (preinstalled, running []string, serving string) {
	preinstalled = []string{}
	if des, err := os.ReadDir(e.NRIPluginDir); err == nil {
		for _, de := range des {
			if strings.Contains(de.Name(), "-") && nriNames().MatchString(de.Name()) {
				preinstalled = append(preinstalled, filepath.Join(e.NRIPluginDir, de.Name()))
			}
		}
	}
	running = nriProcesses(e.Proc.Root)
	if data, err := os.ReadFile(e.NRILock); err == nil {
		serving = strings.TrimSpace(string(data))
	}
	return preinstalled, running, serving
}
