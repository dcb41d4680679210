package doctor

import (
	"fmt"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

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

// nriFindings: a FAIL when the plugin runs (or is pre-installed) on a
// node in shared mode, where it gives nothing to anyone; in exclusive
// mode, a warning for each container of a pod holding RDMA devices that
// the plugin did not adjust (created while it was not serving) and lacks
// the pod's device nodes.
func nriFindings(fs *Findings, e *Env, mode string) *NRIView {
	v := &NRIView{Containers: []NRIContainer{}}
	v.Preinstalled, v.Running, v.Serving = readNRI(e)
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
