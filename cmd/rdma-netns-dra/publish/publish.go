// Package publish is the driver's publishing loop: a scan of the node's
// NICs, merged with the held ones (package slices), published as the
// node's pool when it differs from what was last published. main runs it
// on a ticker against the kubelet plugin helper; make bench-cluster runs
// one per simulated node against a real API server, so what it measures
// is this code.
package publish

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/slices"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// Publisher publishes the node's pool when what it would publish changed.
type Publisher struct {
	Node    string
	Records drarecord.Dir
	Scanner nics.Scanner
	// Sysfs is where the RDMA subsystem's netns mode is read (SharedMode).
	Sysfs string
	Log   *log.Logger
	// Publish is the kubelet plugin helper's PublishResources.
	Publish func(context.Context, resourceslice.DriverResources) error

	last     *resourceslice.DriverResources
	lastNote string
}

// Once scans and publishes if the result changed; errors are logged, and
// the next round tries again.
func (p *Publisher) Once(ctx context.Context) {
	inv, skipped, err := slices.Refresh(p.Scanner, p.Records)
	if err != nil {
		p.note(fmt.Sprintf("not publishing this round: %v", err))
		return
	}
	shared, why := SharedMode(p.Sysfs)
	if why != "" {
		p.note(why)
	}
	res := slices.Resources(p.Node, inv, shared)
	if p.last != nil && reflect.DeepEqual(*p.last, res) {
		return
	}
	if err := p.Publish(ctx, res); err != nil {
		p.Log.Printf("publishing pool %s: %v", p.Node, err)
		return
	}
	p.last = &res
	p.Log.Printf("published pool %s: %s", p.Node, summary(inv, skipped, shared))
}

// note logs a condition once, not every round.
func (p *Publisher) note(s string) {
	if s != p.lastNote {
		p.Log.Print(s)
		p.lastNote = s
	}
}

// SharedMode reads the RDMA subsystem's netns mode as the CNI plugin
// does. In shared mode every netns sees every RDMA device, so no pod can
// hold a NIC of its own: nothing is offered. why says so, or says the
// mode could not be read (then the NICs are offered, and the CNI plugin
// refuses the pod's ADD with the reason).
func SharedMode(sysfs string) (shared bool, why string) {
	param := filepath.Join(sysfs, "module", "ib_core", "parameters", "netns_mode")
	var mode string
	if b, err := os.ReadFile(param); err == nil {
		switch strings.TrimSpace(string(b)) {
		case "Y":
			mode = rdmans.ModeShared
		case "N":
			mode = rdmans.ModeExclusive
		}
	}
	if mode == "" {
		m, err := rdmans.Netlink{}.NetnsMode()
		if err != nil {
			return false, fmt.Sprintf("cannot read the RDMA netns mode (%v); publishing the NICs anyway", err)
		}
		mode = m
	}
	if mode == rdmans.ModeShared {
		return true, "the RDMA subsystem is in shared netns mode, where a pod cannot hold a NIC's RDMA device alone: publishing no devices (`rdma system set netns exclusive` before any RDMA device is in use, or ib_core netns_mode=0, to offer them)"
	}
	return false, ""
}

func summary(inv *slices.Inventory, skipped []nics.Skipped, shared bool) string {
	if shared {
		return "no devices (shared netns mode)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d device(s)", len(inv.NICs))
	for _, name := range sortedKeys(inv) {
		n := inv.NICs[name]
		fmt.Fprintf(&b, "; %s = %s netdev %s RDMA %s", name, n.PCIAddress, n.Netdev, n.RdmaDevice)
	}
	if len(inv.Held) > 0 {
		fmt.Fprintf(&b, "; held by pods, published from the last scan: %s", strings.Join(inv.Held, ", "))
	}
	for _, s := range skipped {
		fmt.Fprintf(&b, "; not offered: RDMA %s (PCI %q): %s", s.RdmaDevice, s.PCIAddress, s.Reason)
	}
	return b.String()
}

func sortedKeys(inv *slices.Inventory) []string {
	var out []string
	for _, d := range inv.Devices() {
		out = append(out, d.Name)
	}
	return out
}
