package plugin

import (
	"fmt"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// nadRecordDir refuses a network whose "dra" names a record directory
// other than the node's. The records say which NICs are a pod's: a NAD
// author who could point rdma-netns at a directory of their own (a pod's
// emptyDir on the node) would write a record naming any NIC of the node.
// A NAD's recordDir is never read; one naming the node's directory is
// accepted, as NADs written before the key was refused set it.
func (c *call) nadRecordDir() error {
	if !c.conf.DRA.ForeignRecordDir() {
		return nil
	}
	return fmt.Errorf("network %s sets dra.recordDir %s, but the record directory is the node's setting, not the network's: rdma-netns reads the DRA driver's records only from %s (the driver's --record-dir, which the chart fixes), so that a pod gets only the NICs of its own claims; remove \"recordDir\" from the network's \"dra\"",
		config.Quote(c.conf.Name), config.Quote(c.conf.DRA.RecordDir), drarecord.DefaultDir)
}
