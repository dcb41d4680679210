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
//
// Its files stand in layers, each using only the ones below it:
//
//   - at the bottom, what is read from the node: RDMA devices from sysfs
//     (sysfs.go), processes from /proc (proc.go, creds.go, ucxenv.go),
//     addresses, ARP settings and routes in a netns (railnet.go), the
//     kernel, the records and the reserved names (env.go), rdma-netns-nri
//     and containerd's bundles (nriread.go), kubectl's NAD JSON
//     (nadjson.go), the DRA driver's records (draread.go), the pod's GPUs
//     and where they and its NICs sit on PCIe (gpuread.go); beside it the
//     findings and the words several checks share (finding.go, words.go,
//     fixes.go), the quoting of names
//     (quote.go) and the report writer (write.go), which knows findings
//     and tables, not checks, and escapes every value it prints;
//   - the checks, a file each, which turn those facts into findings and
//     know no other check: mode.go, records.go, devices.go, needs.go,
//     access.go, ucx.go, rails.go, nri.go, tenancy.go, nadnames.go, dra.go,
//     align.go;
//   - the views, which run the checks of a node, a pod or the NADs and
//     describe what they saw as tables: node.go, pod.go, nads.go;
//   - Report and its entry points (report.go), and the commands with
//     their flags (doctor.go).
//
// A new check is one file, and one line in the view that runs it.
package doctor

import (
	"errors"
	"flag"
	"fmt"
	"github.com/rdma-netns/rdma-netns/pkg/cli"
	"golang.org/x/sys/unix"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

const usage = `Usage: rdma-netns doctor [--json] [--state-dir DIR] [--dra-dir DIR] [--sysfs ROOT]
       rdma-netns doctor --netns PATH | --pid PID [--gpus BDF,...] [--json]
       rdma-netns doctor nads [--json] [FILE]   (rdma-netns doctor nads --help)

Without --netns/--pid: node checks. The RDMA subsystem's netns mode and
whether it survives a reboot; every RDMA device with its driver, PCI
function, ports, netdevs, GIDs, /dev/infiniband nodes and the network
namespace it is in; records of rdma-netns that no longer match the kernel
(drift, pods whose netns is gone) and devices outside the host that no
record owns (leaks); the RDMA device names reserved on the node, each for
the network that gives its pods that name. Where rdma-netns-nri is
(pre-installed in /opt/nri/plugins, or running): a FAIL in shared mode,
where it gives nothing, and in exclusive mode the running containers of
RDMA pods it did not adjust (created while it was not serving), from
containerd's bundles. Where rdma-netns-dra prepared ResourceClaims (its
records in --dra-dir): each claimed NIC with its claim, pod, request, PCI
address and RDMA device, and where the kernel shows it now: a WARN when
it is still on the host (the pod's sandbox has not attached it, or never
will), a FAIL when another pod holds it, a WARN for a record that cannot
be read and for records on a node in shared mode, where the driver
publishes nothing.

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
what it could not give (a bad rdma-netns.io/shm-size). For each GPU the
processes can open (/dev/nvidiaN, /dev/dri/renderDN) or --gpus names: the
pod's NICs under its PCIe root and on its NUMA node, a WARN when none is
under its root.

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
	return runOn(args, stdout, stderr, nil)
}

// runOn is Main with the node replaceable for tests (nil = the real one).
func runOn(args []string, stdout, stderr io.Writer, env *Env) int {
	fl := flag.NewFlagSet("rdma-netns doctor", flag.ContinueOnError)
	asJSON := fl.Bool("json", false, "print the report as JSON")
	netnsPath := fl.String("netns", "", "check the pod whose network namespace is at `PATH` (/run/netns/NAME, /proc/PID/ns/net)")
	pid := fl.Int("pid", 0, "check the pod of process `PID`: its netns, and this process only")
	stateDir := fl.String("state-dir", state.DefaultDir, "rdma-netns state directory (the plugin's stateDir)")
	draDir := fl.String("dra-dir", drarecord.DefaultDir, "`DIR` of rdma-netns-dra's records (one per prepared ResourceClaim); absent = DRA not in use")
	sysfs := fl.String("sysfs", "/sys", "sysfs `ROOT` of the host (for tests)")
	gpuList := fl.String("gpus", "", "with --pid/--netns: PCI addresses (`BDF,BDF`) of GPUs the pod holds besides those in its processes' /dev, e.g. from a DRA claim")
	if code, ok := cli.Parse(fl, usage, args, stderr); !ok {
		return code
	}
	gpus, err := ParseGPUs(*gpuList)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns doctor: --gpus: %v\n", err)
		return 2
	}
	if len(gpus) > 0 && *netnsPath == "" && *pid == 0 {
		fmt.Fprintln(stderr, "rdma-netns doctor: --gpus goes with --pid or --netns (the pod whose NICs they are judged by)")
		return 2
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
	if !filepath.IsAbs(*draDir) {
		fmt.Fprintf(stderr, "rdma-netns doctor: --dra-dir %q must be an absolute path\n", *draDir)
		return 2
	}
	if env == nil {
		env = RealEnv(*sysfs, *stateDir)
		env.DRADir = *draDir
	}

	var r *Report
	switch {
	case *pid != 0:
		r = CheckPod(env, filepath.Join(env.Proc.Root, strconv.Itoa(*pid), "ns", "net"), *pid, gpus...)
	case *netnsPath != "":
		r = CheckPod(env, *netnsPath, 0, gpus...)
	default:
		r = CheckNode(env)
	}
	return printReport(r, *asJSON, stdout, stderr)
}

const nadsUsage = `Usage: rdma-netns doctor nads [--json] [FILE]

  kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads

Checks NetworkAttachmentDefinitions as kubectl prints them with -o json (a
List, or one NAD), read from FILE, or from stdin when FILE is "-" or not
given. For each NAD whose chain has rdma-netns:
  single-tenant  a plugin before rdma-netns declares the deviceID
                 capability, so the pod picks its NIC: WARN when rdma-netns
                 does not declare it too (it cannot see the pick); OK with
                 what rdma-netns then honours when it does
Across NADs:
  name-squat           WARN: a NAD's podRdmaDevNamePrefix lets its pods
                       take the rdmaDevName another NAD gives its pods
  name-prefix-overlap  OK: prefixes of NADs in different namespaces of
                       which one starts with the other
  shared-dev-name      OK: NADs that set the same rdmaDevName (one pod per
                       node across them)
A NAD without rdma-netns is skipped; one whose spec.config does not parse
is a WARN nad-config (a FAIL when rdma-netns itself refuses its entry), and
the others are still checked. Input that is not kubectl's JSON is a FAIL.

Exit status: 1 if anything FAILs, 0 otherwise (warnings alone exit 0), 2 on
a usage error or a FILE that cannot be opened.

Flags:
`

// nadsMain runs `doctor nads` with the arguments after "nads".
func nadsMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("rdma-netns doctor nads", flag.ContinueOnError)
	asJSON := fl.Bool("json", false, "print the report as JSON")
	file, code, ok := parseFileArg(fl, nadsUsage, args, stderr)
	if !ok {
		return code
	}
	in, closeIn, err := openInput(file, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns doctor nads: %v\n", err)
		return 2
	}
	defer closeIn()
	return printReport(CheckNADs(in), *asJSON, stdout, stderr)
}

// parseFileArg parses flags before and after the one FILE argument
// ("-" when there is none), as cli.Parse does.
func parseFileArg(fl *flag.FlagSet, usage string, args []string, stderr io.Writer) (file string, code int, ok bool) {
	cli.SetUsage(fl, usage, stderr)
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", 0, false
		}
		return "", 2, false
	}
	if fl.NArg() == 0 {
		return "-", 0, true
	}
	file = fl.Arg(0)
	if code, ok := cli.Parse(fl, usage, fl.Args()[1:], stderr); !ok {
		return "", code, false
	}
	return file, 0, true
}

// openInput opens FILE, or gives stdin for "-". Stdin on a terminal is a
// usage error rather than a wait for input nobody will type.
func openInput(file string, stdin io.Reader) (io.Reader, func(), error) {
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot read the NADs: %v", err)
		}
		return f, func() { f.Close() }, nil
	}
	if f, ok := stdin.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			return nil, nil, errors.New("stdin is a terminal: pipe the NADs in (kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads) or name a FILE")
		}
	}
	return stdin, func() {}, nil
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
