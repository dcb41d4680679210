package doctor

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// UCX 1.x's defaults: eager messages on one rail, rendezvous on two.
const ucxDefaultEagerRails, ucxDefaultRndvRails = 1, 2

// ucxRails are the ports of the pod's RDMA devices (devs) that
// UCX_NET_DEVICES lets UCX use, as UCX names them (DEVICE:PORT); unset
// or "all", every one.
func ucxRails(u *UCXEnv, devs []Device) []string {
	var all []string
	for _, d := range devs {
		for _, p := range d.Ports {
			all = append(all, fmt.Sprintf("%s:%d", d.Name, p.Port))
		}
	}
	if u.NetDevices == "" || u.NetDevices == "all" {
		return all
	}
	var rails []string
	for _, e := range strings.Split(u.NetDevices, ",") {
		e = strings.TrimSpace(e)
		if slices.Contains(all, e) && !slices.Contains(rails, e) {
			rails = append(rails, e)
		}
	}
	return rails
}

// railCount is a UCX rail count as set, or its default when unset or not
// a positive number (UCX refuses to start on a malformed one).
func railCount(v string, def int) int {
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
		return n
	}
	return def
}

// ucxFinding checks a process that sets UCX variables in a pod holding
// several rails: at UCX's default rail counts eager messages go over one
// rail and rendezvous over two, whatever UCX_NET_DEVICES lists, and
// nothing warns; over rxe's ud_verbs an allreduce over four rails put
// every packet on the first (docs/benchmarks.md).
func ucxFinding(fs *Findings, subj string, pr Process, devs []Device) {
	if pr.UCX == nil {
		return
	}
	rails := ucxRails(pr.UCX, devs)
	if len(rails) < 2 {
		return
	}
	eager := railCount(pr.UCX.MaxEagerRails, ucxDefaultEagerRails)
	rndv := railCount(pr.UCX.MaxRndvRails, ucxDefaultRndvRails)
	n := len(rails)
	if eager >= n && rndv >= n {
		fs.add(OK, "rail-ucx", subj, fmt.Sprintf("UCX may use all %d rails (%s): UCX_MAX_EAGER_RAILS %d, UCX_MAX_RNDV_RAILS %d", n, strings.Join(rails, " "), eager, rndv), "")
		return
	}
	var short []string
	if eager < n {
		short = append(short, fmt.Sprintf("eager messages on at most %d (UCX_MAX_EAGER_RAILS %s)", eager, setOrDefault(pr.UCX.MaxEagerRails)))
	}
	if rndv < n {
		short = append(short, fmt.Sprintf("rendezvous on at most %d (UCX_MAX_RNDV_RAILS %s)", rndv, setOrDefault(pr.UCX.MaxRndvRails)))
	}
	fs.add(Warn, "rail-ucx", subj,
		fmt.Sprintf("UCX is given %d rails (%s) but sends %s: the other rails' NICs carry none of that traffic (over rxe's ud_verbs an allreduce put every byte on the one eager rail)",
			n, strings.Join(rails, " "), strings.Join(short, " and ")),
		fmt.Sprintf("set UCX_MAX_EAGER_RAILS=%d and UCX_MAX_RNDV_RAILS=%d in the container's env (or mpirun -x), as conf/nad-rails.yaml's example pod does, and restart the job", n, n))
}

func setOrDefault(v string) string {
	if v == "" {
		return "unset: UCX's default"
	}
	return strconv.Quote(v)
}
