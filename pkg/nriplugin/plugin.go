// Package nriplugin is rdma-netns-nri: an NRI plugin that gives every
// container of a pod whose network namespace holds RDMA devices what
// verbs needs besides the device (pkg/podadjust decides what), so that
// such a pod runs unprivileged. It connects to the container runtime's
// NRI socket and reconnects whenever the runtime restarts, or the runtime
// launches it from its plugin directory (launched.go); a lock keeps two
// instances from both serving (lock.go).
package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// plugin holds the NRI event handlers; the stub finds them by their
// method sets.
type plugin struct {
	adj *podadjust.Adjuster
	log *logging.Logger
	// who is this instance, as the annotation of the containers it
	// adjusts says (AnnotationAdjustedBy).
	who string
	// launched: the runtime started this process and configures it.
	launched bool
	// proc is where /proc is ("" for /proc); tests point it elsewhere.
	proc string
}

// Annotations the plugin adds to the containers it adjusts (NRI puts them
// in the container's OCI spec), so that the plugin at its next connection
// and `rdma-netns doctor` tell an adjusted container from one created
// while the plugin was away, and which instance adjusted it.
const (
	AnnotationAdjustedBy = "rdma-netns.io/nri-adjusted-by"
	// AnnotationWarnings says what the plugin could not give (a bad
	// rdma-netns.io/shm-size, say), for `rdma-netns doctor --pid`.
	AnnotationWarnings = "rdma-netns.io/nri-warnings"
)

// Configure is the runtime saying hello; the default event mask (the
// handlers below) is what we want. A plugin the runtime launched gets
// its flags here, from the runtime's configuration file for it. A node
// not in exclusive mode is said once here, at each connection, rather
// than at every container: no container will be adjusted (each one's
// decision says so at debug).
func (p *plugin) Configure(_ context.Context, config, runtime, version string) (api.EventMask, error) {
	if p.launched {
		if err := p.configure(config); err != nil {
			return 0, err
		}
	}
	p.log.Infof("connected to %s %s as %s", runtime, version, p.who)
	if reason := p.adj.NotExclusive(); reason != "" {
		p.log.Errorf("%s", reason)
	}
	return 0, nil
}

// CreateContainer adjusts a container of a pod that holds RDMA devices.
// It fails the container only for a pod that asks for more than the node
// allows: the runtime fails the creation with our error, and kubelet puts
// it in the pod's events ("failed to get NRI adjustment for container:
// ... rdma-netns-nri: ..."). A pod the plugin cannot read starts as it
// would without the plugin, and the log says why.
func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	adj, d := p.adj.Adjust(pod, ctr)
	took := time.Since(start)
	if d.Outcome == podadjust.Refused {
		p.log.Warnf("%s: %s", containerName(pod, ctr), d)
		return nil, nil, errors.New(d.Reason)
	}
	if adj != nil {
		adj.AddAnnotation(AnnotationAdjustedBy, p.who)
		if len(d.Warnings) > 0 {
			adj.AddAnnotation(AnnotationWarnings, strings.Join(d.Warnings, "; "))
		}
	}
	name := containerName(pod, ctr)
	switch {
	case adj != nil && len(d.Warnings) > 0:
		p.log.Warnf("%s: %s (%s)", name, d, took)
	case adj != nil:
		p.log.Infof("%s: %s (%s)", name, d, took)
	case d.Outcome == podadjust.NetnsUnknown:
		p.log.Warnf("%s: %s", name, d)
	default:
		p.log.Debugf("%s: %s", name, d)
	}
	return adj, nil, nil
}

// Synchronize looks at the containers that existed before the plugin
// connected. NRI cannot change a running container's devices or limits,
// so the containers of pods holding RDMA devices that were created while
// the plugin was away (a reboot, a rollout, a crash) keep running without
// them: each is logged with what it lacks. Their pod's /dev/shm is grown
// all the same: the remount reaches running containers.
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, l := range existing(p.adj, pods, ctrs, p.procRoot()) {
		if l.warn {
			p.log.Warnf("%s", l.text)
		} else {
			p.log.Infof("%s", l.text)
		}
	}
	return nil, nil
}

func (p *plugin) procRoot() string {
	if p.proc != "" {
		return p.proc
	}
	return "/proc"
}

// Shutdown: the runtime is going away; the run loop reconnects, a
// launched plugin exits.
func (p *plugin) Shutdown(context.Context) {
	p.log.Infof("the runtime is shutting down")
}

type logLine struct {
	text string
	warn bool
}

// existing checks the running containers of pods holding RDMA devices:
// it grows their pod's /dev/shm (as Adjust would have) and says, in one
// line per container created without the plugin, what the container
// lacks, and in a last line the count.
func existing(a *podadjust.Adjuster, pods []*api.PodSandbox, ctrs []*api.Container, procRoot string) []logLine {
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	devices := map[string]string{} // pod ID -> its RDMA devices, "" for none
	var lines []logLine
	var rdma, adjusted, lacking []string
	for _, ctr := range ctrs {
		pod := byID[ctr.GetPodSandboxId()]
		if pod == nil {
			continue
		}
		nodes, _ := a.Nodes(pod)
		if nodes == nil {
			continue
		}
		devs, seen := devices[pod.GetId()]
		if !seen {
			var names []string
			for _, d := range nodes.Devices {
				names = append(names, d.Device)
			}
			devs = strings.Join(names, ",")
			devices[pod.GetId()] = devs
		}
		name := fmt.Sprintf("%s (%s)", containerName(pod, ctr), devs)
		rdma = append(rdma, name)
		_, d := a.Adjust(pod, ctr) // grows the pod's /dev/shm; the rest cannot reach a running container
		if d.Outcome == podadjust.Refused {
			d.Shm = "left as it is: " + d.Reason
		}
		if by, ok := ctr.GetAnnotations()[AnnotationAdjustedBy]; ok {
			adjusted = append(adjusted, name)
			lines = append(lines, logLine{text: fmt.Sprintf("%s: adjusted at its creation by %s; /dev/shm %s", name, by, d.Shm)})
			continue
		}
		lacks := missingNodes(nodes, ctr)
		if m := memlockShort(a.Policy.Memlock, procRoot, ctr.GetPid()); m != "" {
			lacks = append(lacks, m)
		}
		if len(lacks) == 0 {
			continue // given by hand (a privileged pod, a device plugin)
		}
		lacking = append(lacking, name)
		lines = append(lines, logLine{warn: true, text: fmt.Sprintf("%s: created while rdma-netns-nri was not serving, runs without %s "+
			"(NRI cannot change a running container: delete the pod to re-create it with them); /dev/shm %s",
			name, strings.Join(lacks, ", "), d.Shm)})
	}
	s := fmt.Sprintf("at connection %d pod(s) and %d container(s) existed", len(pods), len(ctrs))
	if len(rdma) == 0 {
		return append(lines, logLine{text: s + "; none in a pod holding RDMA devices"})
	}
	sort.Strings(lacking)
	s += fmt.Sprintf("; %d in pods holding RDMA devices: %d adjusted by rdma-netns-nri, %d lacking what it gives", len(rdma), len(adjusted), len(lacking))
	if len(lacking) > 0 {
		s += " (" + strings.Join(lacking, ", ") + "; `rdma-netns doctor` lists them)"
	}
	return append(lines, logLine{text: s, warn: len(lacking) > 0})
}

// missingNodes are the pod's device nodes the container's spec lacks.
func missingNodes(nodes *rdmans.VerbsNodes, ctr *api.Container) []string {
	has := map[string]bool{}
	for _, d := range ctr.GetLinux().GetDevices() {
		has[d.GetPath()] = true
	}
	var want []string
	for _, v := range nodes.Devices {
		if v.Uverbs != nil {
			want = append(want, v.Uverbs.Path())
		}
	}
	if nodes.RdmaCM != nil {
		want = append(want, nodes.RdmaCM.Path())
	}
	var missing []string
	for _, w := range want {
		if !has[w] {
			missing = append(missing, w)
		}
	}
	return missing
}

// memlockShort says "memlock N" when the container's process runs with a
// memlock limit below the policy's, as the kernel reports it in
// /proc/PID/limits (the synchronized containers carry no rlimits).
func memlockShort(m podadjust.Memlock, procRoot string, pid uint32) string {
	if m.Keep || pid == 0 {
		return ""
	}
	data, err := os.ReadFile(fmt.Sprintf("%s/%d/limits", procRoot, pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(l, "Max locked memory")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 || f[0] == "unlimited" {
			return ""
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || n >= m.Limit() {
			return ""
		}
		return "memlock " + podadjust.FormatSize(n)
	}
	return ""
}

func containerName(pod *api.PodSandbox, ctr *api.Container) string {
	return pod.GetNamespace() + "/" + pod.GetName() + "/" + ctr.GetName()
}
