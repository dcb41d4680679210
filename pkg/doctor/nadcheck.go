package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/config"
)

const nadsInputRemedy = "pipe what kubectl prints: kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads"

// NADs checks the NetworkAttachmentDefinitions read from in (kubectl's
// JSON): per NAD, who picks the NIC and whether rdma-netns sees the pick;
// across NADs, the RDMA device names their pods may take from each other.
// A NAD without rdma-netns is skipped; one that does not parse is reported
// and skipped, and the others are still checked.
func NADs(in io.Reader) *Report {
	r := &Report{}
	raws, err := readNADObjects(in)
	if err != nil {
		r.add(Fail, "nads-input", "input", err.Error(), nadsInputRemedy)
		r.finish()
		return r
	}
	nads, read := r.parseNADs(raws)
	r.NADs = &NADsView{Read: read, WithRdmaNetns: []NADView{}}
	for _, n := range nads {
		r.NADs.WithRdmaNetns = append(r.NADs.WithRdmaNetns, n.view())
		for i, pos := range n.rdma {
			r.tenancy(n, pos, n.confs[i])
		}
	}
	uses := nameUses(nads)
	prefixes := newPrefixIndex(uses)
	r.nameSquats(uses, prefixes)
	r.prefixOverlaps(prefixes)
	r.sharedDevNames(uses)
	r.finish()
	return r
}

// parseNADs keeps the NADs that chain rdma-netns, reporting those that do
// not parse; read counts the NADs among the items.
func (r *Report) parseNADs(raws []json.RawMessage) (nads []*nad, read int) {
	for i, raw := range raws {
		n, ok, err := parseNAD(raw)
		if !ok {
			continue
		}
		read++
		if err != nil {
			r.nadError(i, n, err)
			continue
		}
		if len(n.rdma) > 0 {
			nads = append(nads, n)
		}
	}
	return nads, read
}

// nadError reports a NAD that could not be checked.
func (r *Report) nadError(i int, n *nad, err error) {
	subj := fmt.Sprintf("item %d", i)
	edit := "correct the NAD's spec.config"
	if n != nil && n.ref.Name != "" {
		subj = n.ref.String()
		edit = "correct spec.config"
		if kubeName(n.ref.Namespace) && kubeName(n.ref.Name) {
			edit += fmt.Sprintf(" (kubectl edit network-attachment-definitions -n %s %s)", n.ref.Namespace, n.ref.Name)
		}
	}
	var rc *rdmaConfError
	if errors.As(err, &rc) {
		r.add(Fail, "nad-config", subj, "rdma-netns refuses this network's configuration, so every pod that attaches it fails ADD: "+err.Error(),
			edit+" (the keys: docs/configuration.md)")
		return
	}
	r.add(Warn, "nad-config", subj, "cannot check this NAD: "+err.Error()+"; Multus fails every pod that attaches it", edit)
}

// kubeName says whether s is a name the API server gives an object (a DNS
// subdomain: lowercase letters, digits, '-' and '.'): such a name is one
// word to a shell as it is, and a NAD named otherwise did not come from a
// cluster, so no kubectl command is printed for it.
func kubeName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' && c != '.' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

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
func (r *Report) tenancy(n *nad, pos int, c *config.NetConf) {
	picker := deviceIDPicker(n.chain, pos)
	if picker == "" {
		return
	}
	subj, picks := n.ref.String(), podPicks(n, picker)
	switch {
	case !n.chain[pos].DeviceID:
		r.add(Warn, "single-tenant", subj, picks+", and rdma-netns does not see the pick: "+picker+
			" moves whichever NIC a pod names and rdma-netns follows it, so any pod that may use this NAD may take any NIC of the node",
			"declare the deviceID capability on rdma-netns too and list allowedPodDevices, or "+resourceRemedy(n))
	case len(c.AllowedPodDevices) > 0:
		r.add(OK, "single-tenant", subj, fmt.Sprintf("%s; rdma-netns honours the pick only for the RDMA devices in allowedPodDevices (%s) and refuses any other",
			picks, strings.Join(c.AllowedPodDevices, ", ")), "")
	default:
		r.add(OK, "single-tenant", subj, picks+", and rdma-netns refuses a pod's deviceID: "+refusal(c),
			"list the RDMA devices pods may pick in rdma-netns's allowedPodDevices, or drop the deviceID capability from "+picker+" and name the NIC in the NAD")
	}
}

// podPicks says how a pod picks its NIC on this NAD.
func podPicks(n *nad, picker string) string {
	if n.resourceName == "" {
		return "a pod picks its NIC through " + picker + "'s deviceID capability"
	}
	return fmt.Sprintf("a pod allocated no %s picks its NIC through %s's deviceID capability (Multus passes a pod's deviceID when the device plugin allocated nothing)",
		n.resourceName, picker)
}

func resourceRemedy(n *nad) string {
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
