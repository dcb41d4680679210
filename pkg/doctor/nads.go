package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

const nadsInputRemedy = "pipe what kubectl prints: kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads"

// nadChecks checks the NetworkAttachmentDefinitions read from in
// (kubectl's JSON), adding the findings to fs: per NAD, who picks the NIC
// and whether rdma-netns sees the pick; across NADs, the RDMA device names
// their pods may take from each other. A NAD without rdma-netns is
// skipped; one that does not parse is reported and skipped, and the others
// are still checked. Input that is not kubectl's JSON gives no view.
func nadChecks(in io.Reader, fs *Findings) *NADsView {
	raws, err := readNADObjects(in)
	if err != nil {
		fs.add(Fail, "nads-input", "input", err.Error(), nadsInputRemedy)
		return nil
	}
	nads, read := fs.parseNADs(raws)
	v := &NADsView{Read: read, WithRdmaNetns: []NADView{}}
	for _, n := range nads {
		v.WithRdmaNetns = append(v.WithRdmaNetns, n.view())
		for i, pos := range n.rdma {
			fs.tenancy(n, pos, n.confs[i])
			fs.draRecordDir(n, n.confs[i])
			fs.logFile(n, n.confs[i])
			fs.stateDir(n, n.confs[i])
		}
	}
	uses := nameUses(nads)
	prefixes := newPrefixIndex(uses)
	fs.nameSquats(uses, prefixes)
	fs.prefixOverlaps(prefixes)
	fs.sharedDevNames(uses)
	return v
}

// parseNADs keeps the NADs that chain rdma-netns, reporting those that do
// not parse; read counts the NADs among the items.
func (fs *Findings) parseNADs(raws []json.RawMessage) (nads []*parsedNAD, read int) {
	for i, raw := range raws {
		n, ok, err := parseNAD(raw)
		if !ok {
			continue
		}
		read++
		if err != nil {
			fs.nadError(i, n, err)
			continue
		}
		if len(n.rdma) > 0 {
			nads = append(nads, n)
		}
	}
	return nads, read
}

// nadError reports a NAD that could not be checked.
func (fs *Findings) nadError(i int, n *parsedNAD, err error) {
	subj := fmt.Sprintf("item %d", i)
	edit := "correct the NAD's spec.config"
	if n != nil && n.ref.Name != "" {
		subj = n.ref.String()
		edit = "correct spec.config" + editCommand(n.ref)
	}
	var rc *rdmaConfError
	if errors.As(err, &rc) {
		fs.add(Fail, "nad-config", subj, "rdma-netns refuses this network's configuration, so every pod that attaches it fails ADD: "+err.Error(),
			edit+" (the keys: docs/configuration.md)")
		return
	}
	fs.add(Warn, "nad-config", subj, "cannot check this NAD: "+err.Error()+"; Multus fails every pod that attaches it", edit)
}

// editCommand is " (kubectl edit ...)" for the NAD, "" where its name
// could not be pasted as shown.
func editCommand(ref nadRef) string {
	if !kubeName(ref.Namespace) || !kubeName(ref.Name) {
		return ""
	}
	return fmt.Sprintf(" (kubectl edit network-attachment-definitions -n %s %s)", ref.Namespace, ref.Name)
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

// NADsView is what `doctor nads` read.
type NADsView struct {
	// Read counts the NetworkAttachmentDefinitions in the input.
	Read int `json:"read"`
	// WithRdmaNetns are those whose chain has rdma-netns, in input order.
	WithRdmaNetns []NADView `json:"withRdmaNetns"`
}

// sections are the NADs view in the text report.
func (v *NADsView) sections() []section {
	s := section{heading: fmt.Sprintf("NetworkAttachmentDefinitions: %d read, %d with rdma-netns", v.Read, len(v.WithRdmaNetns)),
		header: []string{"NAD", "CHAIN", "RESOURCE", "RDMADEVNAME", "POD NAME PREFIX", "ALLOWED POD DEVICES"}}
	for _, n := range v.WithRdmaNetns {
		s.rows = append(s.rows, []string{nadRef{n.Namespace, n.Name}.String(), chainString(n.Chain), dash(n.ResourceName),
			dash(n.RdmaDevName), dash(n.PodRdmaDevNamePrefix), dash(strings.Join(n.AllowedPodDevices, ","))})
	}
	return []section{s}
}

// chainString shows a chain as "host-device[deviceID] > rdma-netns".
func chainString(chain []ChainPlugin) string {
	parts := make([]string, 0, len(chain))
	for _, p := range chain {
		s := dash(p.Type)
		if p.DeviceID {
			s += "[deviceID]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " > ")
}
