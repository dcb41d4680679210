package exporter

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// NodeInventory is the node as pkg/inventory sees it (the same rule the
// plugin and the doctor apply), with the plugin's records read from
// StateDir without changing anything there.
type NodeInventory struct {
	Node     *inventory.Node
	StateDir string
}

// RealInventory is the running node with the records in stateDir. It only
// finds network namespaces; the collector lists their devices when it
// reads them.
func RealInventory(stateDir string) NodeInventory {
	return NodeInventory{Node: inventory.RealNode(nil), StateDir: stateDir}
}

// Targets implements Inventory. Records that cannot be read cost only
// their pod labels: the namespaces are still found and read.
func (n NodeInventory) Targets() (*Targets, error) {
	recs, recErr := readRecords(n.StateDir)
	self, err := n.Node.SelfID()
	if err != nil {
		return nil, errors.Join(recErr, fmt.Errorf("cannot identify the exporter's network namespace: %v", err))
	}
	// The paths records name come first, so a pod's netns is read (and
	// logged) under the path its runtime gave.
	var preferred []string
	for _, r := range recs {
		preferred = append(preferred, r.Netns)
	}
	return &Targets{
		Self:       self,
		Namespaces: n.Node.Namespaces(self, preferred),
		Records:    recs,
		Identify:   n.Node.Identify,
	}, recErr
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
