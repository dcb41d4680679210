package exporter

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// NodeInventory is the node as pkg/inventory sees it (the same rule the
// plugin and the doctor apply), with the plugin's records read from
// StateDir without changing anything there.
type NodeInventory struct {
	Node     *inventory.Node
	StateDir string
	// DRADir holds rdma-netns-dra's records, "" for none.
	DRADir string
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
	claims, claimErr := readClaims(n.DRADir)
	recErr = errors.Join(recErr, claimErr)
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
		Claims:     claims,
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

// readClaims lists rdma-netns-dra's records; a node without the directory
// does not use DRA. A damaged record costs only its devices' claim
// labels, and is an error to count.
func readClaims(dir string) ([]*drarecord.Claim, error) {
	if dir == "" {
		return nil, nil
	}
	claims, bad, err := drarecord.Dir(dir).List()
	if err != nil {
		return nil, fmt.Errorf("reading the DRA records: %v", err)
	}
	if len(bad) > 0 {
		return claims, fmt.Errorf("%d DRA record(s) cannot be read, the first: %s", len(bad), bad[0])
	}
	return claims, nil
}
