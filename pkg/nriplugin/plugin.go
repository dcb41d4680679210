// Package nriplugin is rdma-netns-nri: an NRI plugin that gives every
// container of a pod whose network namespace holds RDMA devices what
// verbs needs besides the device (pkg/podadjust decides what), so that
// such a pod runs unprivileged. It connects to the container runtime's
// NRI socket and reconnects whenever the runtime restarts.
package nriplugin

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
)

// plugin holds the NRI event handlers; the stub finds them by their
// method sets.
type plugin struct {
	adj *podadjust.Adjuster
	log *logging.Logger
}

// Configure is the runtime saying hello; the default event mask (the
// handlers below) is what we want. A node not in exclusive mode is said
// once here, at each connection, rather than at every container: no
// container will be adjusted (each one's decision says so at debug).
func (p *plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	p.log.Infof("connected to %s %s", runtime, version)
	if reason := p.adj.NotExclusive(); reason != "" {
		p.log.Errorf("%s", reason)
	}
	return 0, nil
}

// CreateContainer adjusts a container of a pod that holds RDMA devices.
// It never fails the container: a pod the plugin cannot read starts as it
// would without the plugin, and the log says why.
func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	adj, d := p.adj.Adjust(pod, ctr)
	took := time.Since(start)
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

// Synchronize reports the containers that existed before the plugin
// connected and belong to pods holding RDMA devices: NRI cannot change a
// running container's devices or limits, so they are left as they are.
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.log.Infof("%s", existing(p.adj, pods, ctrs))
	return nil, nil
}

// Shutdown: the runtime is going away; the run loop reconnects.
func (p *plugin) Shutdown(context.Context) {
	p.log.Infof("the runtime is shutting down")
}

// existing says in one line which running containers are in pods holding
// RDMA devices.
func existing(a *podadjust.Adjuster, pods []*api.PodSandbox, ctrs []*api.Container) string {
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	devices := map[string]string{} // pod ID -> its RDMA devices, "" for none
	var rdma []string
	for _, ctr := range ctrs {
		pod := byID[ctr.GetPodSandboxId()]
		if pod == nil {
			continue
		}
		devs, seen := devices[pod.GetId()]
		if !seen {
			devs = podDevices(a, pod)
			devices[pod.GetId()] = devs
		}
		if devs != "" {
			rdma = append(rdma, fmt.Sprintf("%s (%s)", containerName(pod, ctr), devs))
		}
	}
	s := fmt.Sprintf("at connection %d pod(s) and %d container(s) existed", len(pods), len(ctrs))
	if len(rdma) == 0 {
		return s + "; none in a pod holding RDMA devices"
	}
	sort.Strings(rdma)
	return s + fmt.Sprintf("; %d in pods holding RDMA devices, left as they are (only containers created from now on are adjusted; "+
		"`rdma-netns doctor --pid PID` shows what one lacks): %s", len(rdma), strings.Join(rdma, ", "))
}

// podDevices names the RDMA devices of a pod whose containers Adjust
// would adjust, "" for any other pod.
func podDevices(a *podadjust.Adjuster, pod *api.PodSandbox) string {
	nodes, _ := a.Nodes(pod)
	if nodes == nil {
		return ""
	}
	var names []string
	for _, d := range nodes.Devices {
		names = append(names, d.Device)
	}
	return strings.Join(names, ",")
}

func containerName(pod *api.PodSandbox, ctr *api.Container) string {
	return pod.GetNamespace() + "/" + pod.GetName() + "/" + ctr.GetName()
}
