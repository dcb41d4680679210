// Package doctor answers, for a person at a node, why RDMA does or does not
// work for pods: `rdma-netns doctor` checks the node (the RDMA subsystem's
// netns mode, every RDMA device and where it is, leaks and drift against
// the plugin's records), `rdma-netns doctor --netns PATH|--pid PID` one
// pod (its devices, GIDs, rails, and the memlock limit, /dev/shm and
// /dev/infiniband of its processes), `rdma-netns doctor nads` the
// cluster's NetworkAttachmentDefinitions (who picks the NIC, and the RDMA
// device names their pods may take from each other's).
//
// Every finding is ok, warn or fail with a reason and a remedy. The exit
// status is 1 when any finding fails, 0 otherwise (warnings alone do not
// fail), 2 on a usage error.
package doctor

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/rdma-netns/rdma-netns/pkg/cli"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

const usage = `Usage: rdma-netns doctor [--json] [--state-dir DIR] [--sysfs ROOT]
       rdma-netns doctor --netns PATH | --pid PID [--json]
       rdma-netns doctor nads [--json] [FILE]   (rdma-netns doctor nads --help)

Without --netns/--pid: node checks. The RDMA subsystem's netns mode and
whether it survives a reboot; every RDMA device with its driver, PCI
function, ports, netdevs, GIDs, /dev/infiniband nodes and the network
namespace it is in; records of rdma-netns that no longer match the kernel
(drift, pods whose netns is gone) and devices outside the host that no
record owns (leaks). Where rdma-netns-nri is (pre-installed in
/opt/nri/plugins, or running): a FAIL in shared mode, where it gives
nothing, and in exclusive mode the running containers of RDMA pods it did
not adjust (created while it was not serving), from containerd's bundles.

With --netns or --pid: pod checks. The RDMA devices in that network
namespace with their ports, netdevs and GIDs; its rails (each port's
netdev, its IPv4 addresses and their RoCE v2 GIDs, and for rails sharing
a subnet whether arp_ignore/arp_announce and the routes from each rail's
address keep its traffic on its own NIC; the fix is tuning and sbr in
each rail's attachment, conf/nad-rails-shared-subnet.yaml); for each
process in it (or just PID): the memlock limit and CAP_IPC_LOCK (RDMA
memory registration), the size of its /dev/shm (NCCL, PyTorch) and the
/dev/infiniband nodes it can open against those its pod's devices need
(the uverbs node the kernel names for each, and rdma_cm): the three
rdma-netns-nri gives a container, with it or the pod setting as the fix of each; and whether the process,
by its uid, groups and capabilities in its user namespace, may open
those nodes (a hostUsers: false pod gets the node's own, whose mode then
applies). With --pid, what
rdma-netns-nri wrote on the process's container: who adjusted it, and
what it could not give (a bad rdma-netns.io/shm-size).

With nads: the NetworkAttachmentDefinitions that kubectl get
network-attachment-definitions -A -o json prints, from FILE or stdin. Who
picks each NAD's NIC (a pod, through a deviceID capability before
rdma-netns, or the NAD), and the RDMA device names pods of one NAD may take
from another's; runs anywhere, no root.

Each finding is OK, WARN or FAIL with a reason and a fix. Exit status: 1 if
anything FAILs, 0 otherwise (warnings alone exit 0), 2 on a usage error.
Run as root on the node (it enters network namespaces and /proc/PID/root).

Flags:
`

// Main runs the doctor with the arguments after "doctor" and returns the
// exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "nads" {
		return nadsMain(args[1:], os.Stdin, stdout, stderr)
	}
	return run(args, stdout, stderr, nil)
}

// run is Main with the node replaceable for tests (nil = the real one).
func run(args []string, stdout, stderr io.Writer, env *Env) int {
	fl := flag.NewFlagSet("rdma-netns doctor", flag.ContinueOnError)
	fl.SetOutput(stderr)
	asJSON := fl.Bool("json", false, "print the report as JSON")
	netnsPath := fl.String("netns", "", "check the pod whose network namespace is at `PATH` (/run/netns/NAME, /proc/PID/ns/net)")
	pid := fl.Int("pid", 0, "check the pod of process `PID`: its netns, and this process only")
	stateDir := fl.String("state-dir", state.DefaultDir, "rdma-netns state directory (the plugin's stateDir)")
	sysfs := fl.String("sysfs", "/sys", "sysfs `ROOT` of the host (for tests)")
	fl.Usage = func() {
		fmt.Fprint(stderr, usage)
		fl.PrintDefaults()
	}
	if code, ok := cli.Parse(fl, args, stderr); !ok {
		return code
	}
	if *netnsPath != "" && *pid != 0 {
		fmt.Fprintln(stderr, "rdma-netns doctor: give --netns or --pid, not both")
		return 2
	}
	if *pid < 0 {
		fmt.Fprintln(stderr, "rdma-netns doctor: --pid must be positive")
		return 2
	}
	if !filepath.IsAbs(*stateDir) {
		fmt.Fprintf(stderr, "rdma-netns doctor: --state-dir %q must be an absolute path\n", *stateDir)
		return 2
	}
	if env == nil {
		env = RealEnv(*sysfs, *stateDir)
	}

	var r *Report
	switch {
	case *pid != 0:
		r = Pod(env, filepath.Join(env.Proc.Root, strconv.Itoa(*pid), "ns", "net"), *pid)
	case *netnsPath != "":
		r = Pod(env, *netnsPath, 0)
	default:
		r = Node(env)
	}
	return printReport(r, *asJSON, stdout, stderr)
}

// printReport prints the report and returns the exit status.
func printReport(r *Report, asJSON bool, stdout, stderr io.Writer) int {
	var err error
	if asJSON {
		err = r.WriteJSON(stdout)
	} else {
		err = r.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns doctor: %v\n", err)
		return 1
	}
	return r.ExitCode
}
