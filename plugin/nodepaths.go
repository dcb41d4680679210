package plugin

import (
	"fmt"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
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

// nadLogFile refuses a network whose logFile is outside the node's log
// directory: the plugin runs as root, and a NAD author who could name any
// path would have it append to any file of the node. The file is never
// opened (newCall drops it: logFile); ADD refuses the network so that its author learns
// why, while DEL and the other verbs run on, logging to the runtime alone.
func (c *call) nadLogFile() error {
	if !c.conf.ForeignLogFile() {
		return nil
	}
	return fmt.Errorf("network %s sets logFile %s, but rdma-netns writes log files only in the node's directory %s: name a file there (%s/rdma-netns.log), or remove \"logFile\"; nothing was changed",
		config.Quote(c.conf.Name), config.Quote(c.conf.LogFile), logging.Dir, logging.Dir)
}

// nadStateDir refuses a network whose stateDir is not the node's: the
// plugin writes its records as root, and a NAD author who could name the
// directory would have it create files in any directory of the node. The
// NAD's stateDir is never used (openStore takes the node's); ADD refuses
// the network so that its author learns why, while DEL and the other verbs
// run on with the node's records. One naming the node's directory is
// accepted, as NADs written before the key was refused set it.
func (c *call) nadStateDir() error {
	if !c.conf.ForeignStateDir() {
		return nil
	}
	return fmt.Errorf("network %s sets stateDir %s, but rdma-netns keeps its records only in the node's directory %s, which the exporter and the doctor read; remove \"stateDir\" from the network; nothing was changed",
		config.Quote(c.conf.Name), config.Quote(c.conf.StateDir), config.DefaultStateDir)
}
