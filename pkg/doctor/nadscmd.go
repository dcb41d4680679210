package doctor

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rdma-netns/rdma-netns/pkg/cli"
	"golang.org/x/sys/unix"
)

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
	fl.SetOutput(stderr)
	asJSON := fl.Bool("json", false, "print the report as JSON")
	fl.Usage = func() {
		fmt.Fprint(stderr, nadsUsage)
		fl.PrintDefaults()
	}
	file, code, ok := parseFileArg(fl, args, stderr)
	if !ok {
		return code
	}
	in, closeIn, err := openInput(file, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns doctor nads: %v\n", err)
		return 2
	}
	defer closeIn()
	return printReport(NADs(in), *asJSON, stdout, stderr)
}

// parseFileArg parses flags before and after the one FILE argument
// ("-" when there is none).
func parseFileArg(fl *flag.FlagSet, args []string, stderr io.Writer) (file string, code int, ok bool) {
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
	if code, ok := cli.Parse(fl, fl.Args()[1:], stderr); !ok {
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
