package doctor

import (
	"errors"
	"io/fs"
	"os"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// draRecords is what rdma-netns-dra, the node's DRA driver, recorded: one
// file per prepared ResourceClaim. Every string in them came from the
// API server (claim, pod and request names), untrusted as the pod.
type draRecords struct {
	Dir string
	// Present is false where the directory does not exist: DRA is not in
	// use on this node.
	Present bool
	Claims  []*drarecord.Claim
	// Bad are the records that could not be read, each "path: why".
	Bad []string
	// Err is set when the directory itself could not be read.
	Err error
}

// draRecords reads the DRA records without creating their directory;
// Env.DRADir "" leaves them out.
func (e *Env) draRecords() draRecords {
	r := draRecords{Dir: e.DRADir}
	if e.DRADir == "" {
		return r
	}
	if _, err := os.Stat(e.DRADir); errors.Is(err, fs.ErrNotExist) {
		return r
	}
	r.Present = true
	r.Claims, r.Bad, r.Err = drarecord.Dir(e.DRADir).List()
	return r
}
