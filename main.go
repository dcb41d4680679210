// Command rdma-netns is a CNI meta-plugin that moves the RDMA device of a
// pod's netdev into the pod's network namespace. The container runtime
// runs it with CNI_COMMAND set; run by a person, it offers `doctor`
// (diagnostics) and `install` (copies itself into a CNI bin directory, for
// the DaemonSet).
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
	bv "github.com/containernetworking/plugins/pkg/utils/buildversion"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/install"
	"github.com/rdma-netns/rdma-netns/plugin"
)

func main() {
	supported := version.PluginSupports(config.SupportedVersions...)
	if os.Getenv("CNI_COMMAND") == "" {
		info, _ := debug.ReadBuildInfo()
		bv.BuildVersion = buildVersion(bv.BuildVersion, info)
		os.Exit(command(os.Args[1:], supported, os.Stdout, os.Stderr))
	}
	// skel prints its "about" text only when CNI_COMMAND is unset, the
	// branch above: a runtime's call, paid for at every pod start, does
	// not parse the build information (module list and settings) that
	// only a person's help and install print.
	skel.PluginMainFuncs(plugin.New().Funcs(), supported, "")
}

// unstamped is what the buildversion package says when `make build` did
// not set the version at link time.
const unstamped = "version unknown"

// buildVersion is the version stamped at link time, else the one Go
// recorded for the main module (a tag, or a pseudo-version of the commit
// with +dirty for uncommitted changes), else the commit alone.
func buildVersion(stamped string, info *debug.BuildInfo) string {
	if stamped != unstamped || info == nil {
		return stamped
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return stamped
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "+dirty"
	}
	return "devel-" + rev
}

const commands = `
rdma-netns is a CNI plugin: the container runtime runs it, with CNI_COMMAND
set, after the plugin that moves a NIC into a pod (host-device, sriov), and
it moves that NIC's RDMA device into the pod with it.

Commands for a person at the node:
  doctor    check the node (netns mode, where every RDMA device is, records
            that no longer match the kernel), or with --pid PID / --netns PATH
            one pod (its devices, memlock, CAP_IPC_LOCK, /dev/shm); "doctor
            nads" checks NetworkAttachmentDefinitions (who picks the NIC,
            device names pods may take from another NAD's):
            kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads
  install   copy this binary into a CNI bin directory (the DaemonSet's
            init container runs it)
  help      this text

"rdma-netns COMMAND --help" describes a command's flags.
`

// command runs what a person asked for: doctor, install or help. Without
// arguments it prints the help too, which starts with the CNI "about"
// text (name, version, protocol versions).
func command(args []string, supported version.PluginInfo, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return help(supported, stdout)
	}
	switch args[0] {
	case "doctor":
		return doctor.Main(args[1:], stdout, stderr)
	case "install":
		return install.Main(args[1:], bv.BuildVersion, stdout, stderr)
	case "help", "-h", "-help", "--help":
		return help(supported, stdout)
	}
	fmt.Fprintf(stderr, "rdma-netns: unknown command %q: the commands are doctor, install and help (\"rdma-netns help\")\n", args[0])
	return 2
}

func help(supported version.PluginInfo, stdout io.Writer) int {
	fmt.Fprintln(stdout, bv.BuildString("rdma-netns"))
	fmt.Fprintf(stdout, "CNI protocol versions supported: %s\n", strings.Join(supported.SupportedVersions(), ", "))
	fmt.Fprint(stdout, commands)
	return 0
}
