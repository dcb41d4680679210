package exporter

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// NodeInventory is the node as pkg/inventory sees it (the same rule the
// plugin and the doctor apply), with the plugin's records read from
// StateDir without changing anything there.
type NodeInventory struct {
	Node     *inventory.Node
	StateDir string
}

// RealInventory is the running node with the records in stateDir.
func RealInventory(stateDir string) NodeInventory {
	return NodeInventory{Node: inventory.RealNode(netlinkKernel{}), StateDir: stateDir}
}

// Placements implements Inventory. Records that cannot be read cost only
// their pod labels: the devices are still found and reported.
func (n NodeInventory) Placements() ([]Placement, error) {
	recs, recErr := readRecords(n.StateDir)
	snap, err := n.Node.Scan(recs)
	if err != nil {
		return nil, errors.Join(recErr, err)
	}
	errs := []error{recErr}
	for _, ns := range snap.Namespaces {
		if ns.Err != "" {
			errs = append(errs, fmt.Errorf("listing the RDMA devices of netns %s: %s", ns.Path, ns.Err))
		}
	}
	var out []Placement
	for _, p := range snap.Placements(recs, n.Node.Identify) {
		pl := Placement{Device: p.Device, Record: p.Record}
		if p.Netns != nil {
			pl.Netns = p.Netns.Path
		}
		out = append(out, pl)
	}
	return out, errors.Join(errs...)
}

// readRecords lists the records without creating the state directory: a
// node where no pod was attached yet has none.
func readRecords(dir string) ([]*state.Record, error) {
	st, err := state.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return st.List()
}

// netlinkKernel lists devices over RDMA netlink, "" being the caller's netns.
type netlinkKernel struct{ rdmans.Netlink }

func (k netlinkKernel) DevicesIn(nsPath string) ([]string, error) {
	if nsPath == "" {
		return k.HostDevices()
	}
	return k.Netlink.DevicesIn(nsPath)
}
