package doctor

import (
	"bytes"
	"io"
	"os"
	"strings"
)

// UCXEnv is what a process's environment tells UCX (Open MPI's pml ucx,
// UCC, NCCL's UCX plugin) about rails; only these three variables are
// read, nothing else of the environment is kept or shown.
type UCXEnv struct {
	// NetDevices is UCX_NET_DEVICES as set, "" when unset (UCX's "all").
	NetDevices string `json:"netDevices,omitempty"`
	// MaxEagerRails and MaxRndvRails are UCX_MAX_EAGER_RAILS and
	// UCX_MAX_RNDV_RAILS as set, "" when unset.
	MaxEagerRails string `json:"maxEagerRails,omitempty"`
	MaxRndvRails  string `json:"maxRndvRails,omitempty"`
}

// maxEnviron bounds what is read of /proc/PID/environ.
const maxEnviron = 1 << 20

// readUCXEnv reads the UCX variables of the environment in
// /proc/PID/environ at path; nil when the process sets none (it does not
// use UCX, or says nothing about it) or the file cannot be read.
func readUCXEnv(path string) *UCXEnv {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEnviron))
	if err != nil {
		return nil
	}
	return parseUCXEnv(b)
}

// parseUCXEnv picks the UCX variables out of a NUL-separated environment.
func parseUCXEnv(environ []byte) *UCXEnv {
	var u UCXEnv
	found := false
	for _, kv := range bytes.Split(environ, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok || !strings.HasPrefix(k, "UCX_") {
			continue
		}
		found = true
		switch k {
		case "UCX_NET_DEVICES":
			u.NetDevices = v
		case "UCX_MAX_EAGER_RAILS":
			u.MaxEagerRails = v
		case "UCX_MAX_RNDV_RAILS":
			u.MaxRndvRails = v
		}
	}
	if !found {
		return nil
	}
	return &u
}
