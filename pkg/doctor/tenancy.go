package doctor

import (
	"fmt"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
)

// deviceIDPicker is the first plugin before pos that declares the
// deviceID capability, "" if none.
func deviceIDPicker(chain []ChainPlugin, pos int) string {
	for _, p := range chain[:pos] {
		if p.DeviceID {
			return p.Type
		}
	}
	return ""
}

// tenancy checks who picks the NIC: a plugin before rdma-netns with the
// deviceID capability lets the pod pick it (host-device takes
// runtimeConfig.deviceID over its own device).
func (fs *Findings) tenancy(n *parsedNAD, pos int, c *config.NetConf) {
	picker := deviceIDPicker(n.chain, pos)
	if picker == "" {
		return
	}
	subj, picks := n.ref.String(), podPicks(n, picker)
	switch {
	case !n.chain[pos].DeviceID:
		fs.add(Warn, "single-tenant", subj, picks+", and rdma-netns does not see the pick: "+picker+
			" moves whichever NIC a pod names and rdma-netns follows it, so any pod that may use this NAD may take any NIC of the node",
			"declare the deviceID capability on rdma-netns too and list allowedPodDevices, or "+resourceRemedy(n))
	case len(c.AllowedPodDevices) > 0:
		fs.add(OK, "single-tenant", subj, fmt.Sprintf("%s; rdma-netns honours the pick only for the RDMA devices in allowedPodDevices (%s) and refuses any other",
			picks, strings.Join(c.AllowedPodDevices, ", ")), "")
	default:
		fs.add(OK, "single-tenant", subj, picks+", and rdma-netns refuses a pod's deviceID: "+refusal(c),
			"list the RDMA devices pods may pick in rdma-netns's allowedPodDevices, or drop the deviceID capability from "+picker+" and name the NIC in the NAD")
	}
}

// podPicks says how a pod picks its NIC on this NAD.
func podPicks(n *parsedNAD, picker string) string {
	if n.resourceName == "" {
		return "a pod picks its NIC through " + picker + "'s deviceID capability"
	}
	return fmt.Sprintf("a pod allocated no %s picks its NIC through %s's deviceID capability (Multus passes a pod's deviceID when the device plugin allocated nothing)",
		n.resourceName, picker)
}

func resourceRemedy(n *parsedNAD) string {
	if n.resourceName == "" {
		return "give the NAD a device plugin resourceName"
	}
	return "have every pod of this NAD request " + n.resourceName + " (the network-resources-injector adds the request)"
}

// refusal says which pod deviceIDs rdma-netns takes when the network lists
// no allowedPodDevices: only one naming the device the NAD pins.
func refusal(c *config.NetConf) string {
	pin := c.NetworkDevice()
	if pin.Value == "" {
		pin = c.NetworkDeviceID()
	}
	if pin.Value == "" {
		return "the network lists no allowedPodDevices and pins no device, so ADD fails for a pod that sets a deviceID"
	}
	return fmt.Sprintf("the network lists no allowedPodDevices, so it honours only a deviceID naming the device the NAD pins (%s %s)", pin.From, pin.Value)
}

// logFile names a NAD whose logFile is outside the node's log directory:
// rdma-netns refuses it, since the plugin runs as root and would append
// to whatever file the NAD named.
func (fs *Findings) logFile(n *parsedNAD, c *config.NetConf) {
	if !c.ForeignLogFile() {
		return
	}
	fs.add(Fail, "log-file", n.ref.String(), fmt.Sprintf("the rdma-netns entry sets logFile %s, so every pod that attaches it fails ADD: rdma-netns writes log files only in the node's directory %s (it runs as root, and a network must not choose which file of the node it appends to)",
		config.Quote(c.LogFile), logging.Dir),
		fmt.Sprintf(`name a file in %s in its rdma-netns entry's "logFile", or remove the key`, logging.Dir)+editCommand(n.ref))
}

// stateDir names a NAD whose stateDir is not the node's: rdma-netns
// refuses it, since the plugin runs as root and would create its records
// in whatever directory the NAD named.
func (fs *Findings) stateDir(n *parsedNAD, c *config.NetConf) {
	if !c.ForeignStateDir() {
		return
	}
	fs.add(Fail, "state-dir", n.ref.String(), fmt.Sprintf("the rdma-netns entry sets stateDir %s, so every pod that attaches it fails ADD: rdma-netns keeps its records only in the node's directory %s (it runs as root, and a network must not choose where on the node it writes)",
		config.Quote(c.StateDir), config.DefaultStateDir),
		`remove "stateDir" from its rdma-netns entry`+editCommand(n.ref))
}

// draRecordDir names a NAD whose "dra" sets a record directory other than
// the node's: rdma-netns refuses it, since a NAD that chose where the
// records are read could write one naming any NIC of the node.
func (fs *Findings) draRecordDir(n *parsedNAD, c *config.NetConf) {
	if !c.DRA.ForeignRecordDir() {
		return
	}
	fs.add(Fail, "dra-record-dir", n.ref.String(), fmt.Sprintf("the rdma-netns entry sets dra.recordDir %s, so every pod that attaches it fails ADD: rdma-netns reads the DRA driver's records only from the node's directory %s (rdma-netns-dra's --record-dir, which the chart fixes), so that a pod gets only the NICs of its own claims",
		config.Quote(c.DRA.RecordDir), drarecord.DefaultDir),
		`remove "recordDir" from the "dra" of its rdma-netns entry`+editCommand(n.ref))
}
