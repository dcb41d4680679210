package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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
	r.nameSquats(uses)
	r.prefixOverlaps(uses)
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

// nameUse is what one rdma-netns entry lets pods call their device.
type nameUse struct {
	ref     nadRef
	devName string
	prefix  string
}

func nameUses(nads []*nad) []nameUse {
	var uses []nameUse
	for _, n := range nads {
		for _, c := range n.confs {
			if c.RdmaDevName != "" || c.PodRdmaDevNamePrefix != "" {
				uses = append(uses, nameUse{n.ref, c.RdmaDevName, c.PodRdmaDevNamePrefix})
			}
		}
	}
	return uses
}

// nameSquats finds a prefix of one NAD under which its pods may take the
// rdmaDevName of another: first come on each node until the plugin has
// reserved the name there for the network that used it.
func (r *Report) nameSquats(uses []nameUse) {
	for _, x := range uses {
		for _, y := range uses {
			p, name := x.prefix, y.devName
			if x.ref == y.ref || p == "" || name == p || !strings.HasPrefix(name, p) {
				continue
			}
			r.add(Warn, "name-squat", x.ref.String(), fmt.Sprintf(
				"pods of %s may name their device %s (podRdmaDevNamePrefix %s), the name %s gives its pods (rdmaDevName); on a node where no pod of %s has run yet, a pod of %s can take it first and %s's pods then fail there",
				x.ref, name, p, y.ref, y.ref, x.ref, y.ref),
				fmt.Sprintf("keep podRdmaDevNamePrefix disjoint from every rdmaDevName: change %s's podRdmaDevNamePrefix or %s's rdmaDevName", x.ref, y.ref))
		}
	}
}

// prefixOverlaps finds prefixes of NADs in different namespaces under
// which pods of both may ask for the same names.
func (r *Report) prefixOverlaps(uses []nameUse) {
	for i, x := range uses {
		for _, y := range uses[i+1:] {
			if x.prefix == "" || y.prefix == "" || x.ref.Namespace == y.ref.Namespace {
				continue
			}
			if !strings.HasPrefix(x.prefix, y.prefix) && !strings.HasPrefix(y.prefix, x.prefix) {
				continue
			}
			r.add(OK, "name-prefix-overlap", x.ref.String(), fmt.Sprintf(
				"pods of %s (podRdmaDevNamePrefix %s) and of %s (podRdmaDevNamePrefix %s), in another namespace, may ask for the same device names: on a node the first pod to take a name has it, and the other's ADD fails",
				x.ref, x.prefix, y.ref, y.prefix),
				"give the namespaces prefixes neither of which starts with the other")
		}
	}
}

// sharedDevNames finds an rdmaDevName set by several NADs: device names
// are node-wide, so one pod per node across them can have it.
func (r *Report) sharedDevNames(uses []nameUse) {
	byName := map[string][]string{}
	var names []string
	for _, u := range uses {
		if u.devName == "" || slices.Contains(byName[u.devName], u.ref.String()) {
			continue
		}
		if byName[u.devName] == nil {
			names = append(names, u.devName)
		}
		byName[u.devName] = append(byName[u.devName], u.ref.String())
	}
	for _, name := range names {
		if refs := byName[name]; len(refs) > 1 {
			r.add(OK, "shared-dev-name", name, fmt.Sprintf(
				"%s all set rdmaDevName %s: RDMA device names are unique on a node, so one pod per node across these NADs can hold it",
				strings.Join(refs, ", "), name),
				"give each NAD its own rdmaDevName where their pods must share nodes")
		}
	}
}
