package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/install"
)

// claimsEntryPlugin is the plugin type the chart's installer appends to
// the node's primary network as its claims entry.
const claimsEntryPlugin = "rdma-netns"

// claimsEntryFindings checks the claims entry (rdma-netns install
// --claims-entry) against what it needs and what needs it: an entry
// naming a plugin the runtime cannot find fails every pod sandbox of the
// node, pods or not of a claim; a prepared claim that configures the
// driver without an entry got none of its NICs.
func claimsEntryFindings(fs *Findings, e *Env, rs draRecords) {
	if e.CNIConfDir == "" {
		return
	}
	var attach []string
	for _, c := range rs.Claims {
		if c.Attach {
			attach = append(attach, c.ClaimNamespace+"/"+c.ClaimName)
		}
	}
	path, found, err := install.FindClaimsEntry(e.CNIConfDir, claimsEntryPlugin)
	switch {
	case err != nil && len(attach) == 0:
		return // no primary network to judge, and nothing needs one
	case err != nil:
		fs.add(Fail, "claims-entry", e.CNIConfDir, fmt.Sprintf("%d prepared claim(s) (%s) give their NICs to their pods by the claims entry, but the node's primary network cannot be read: %v", len(attach), strings.Join(attach, ", "), err),
			"check the runtime's CNI configuration directory")
		return
	case !found && len(attach) > 0:
		fs.add(Fail, "claims-entry", path, fmt.Sprintf("%d prepared claim(s) (%s) configure driver nic.rdma-netns.io, so they give their NICs to their pods by the claims entry, which the node's primary network lacks: those pods run without their NICs", len(attach), strings.Join(attach, ", ")),
			"install the chart with dra.enabled and dra.claimsEntry (the default), or on the node: rdma-netns install --claims-entry; then delete and recreate the pods")
		return
	case !found:
		return
	}
	bin := filepath.Join(e.CNIBinDir, claimsEntryPlugin)
	if st, err := os.Stat(bin); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		fs.add(Fail, "claims-entry", path, fmt.Sprintf("the node's primary network has rdma-netns's claims entry, but %s is not an executable plugin: every pod sandbox on this node fails, whether or not it holds a claim", bin),
			"install the binary again (the chart's init container does), or take the entry out: rdma-netns install --remove-claims-entry")
		return
	}
	fs.add(OK, "claims-entry", path, fmt.Sprintf("has rdma-netns's claims entry and %s is in place: pods get their claims' NICs when their sandbox is made (%d prepared claim(s) use it)", bin, len(attach)), "")
}
