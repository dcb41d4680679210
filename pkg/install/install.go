// Package install is `rdma-netns install`: the binary copies itself into a
// CNI bin directory, which is all the DaemonSet's image has to do, so the
// image needs no shell and no cp.
//
// The container runtime may execute the plugin at any moment (any pod start
// or stop on the node), so it must never see a half-written file: the copy
// is written under a temporary name in the destination directory, synced,
// run once (CNI VERSION) to prove it executes on this node, and renamed over
// the old binary. rename(2) within one directory is atomic, and a plugin run
// in progress keeps the old inode and finishes normally.
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/cli"
)

const usage = `Usage: rdma-netns install [--dest DIR] [--name NAME] [--then-wait]
                          [--nri PATH [--nri-plugin-dir DIR] [--nri-conf-dir DIR] [--nri-index NN] [-- NRI-FLAGS...]]
                          [--claims-entry [--cni-conf-dir DIR]]
       rdma-netns install --remove-claims-entry [--name NAME] [--cni-conf-dir DIR]

Copies this binary into the CNI bin directory DIR as NAME, atomically: it
writes a temporary file in DIR, syncs it, checks that it answers CNI VERSION,
sets mode 0755 and renames it over DIR/NAME. A plugin run in progress keeps
the old file. On any failure DIR/NAME is left as it was.

With --nri it also installs the NRI plugin PATH (rdma-netns-nri) where the
container runtime starts it itself, before it serves containers, each time
it starts: DIR/NN-rdma-netns-nri in --nri-plugin-dir, with NRI-FLAGS (its
own flags, e.g. --shm-size 1Gi) as its configuration in --nri-conf-dir.
Both are written the same way (temporary file, synced, renamed), after the
copy has checked the configuration; a copy under another index is removed.
The runtime runs the new copy from its next start on.

With --claims-entry it then appends {"type": NAME, "claims": true} to the
plugins of the node's primary network (the first configuration in DIR by
name, or with Multus the first after Multus's own): the entry that gives
pods the NICs of their claims when the claim alone asks for them. The file
is rewritten atomically, everything else in it kept; a .conf file (one
plugin, no chain) is refused. --remove-claims-entry takes it out again.

With --then-wait it then sleeps until SIGTERM or SIGINT and exits 0: the
long-running container of a DaemonSet that only installs. With
--claims-entry it puts the entry back whenever the primary network's file
is written again without it (every 10 s).

Flags:
`

// Options is what the command line asks for.
type Options struct {
	Dest     string // directory to install into
	Name     string // file name in Dest
	ThenWait bool   // sleep until a termination signal after installing
	// NRI is the NRI plugin to install ("" for none) and where; its
	// Flags are the arguments after the install flags.
	NRI NRI
	// ClaimsEntry appends the plugin's claims entry to the node's
	// primary network in CNIConfDir once the binary is in place (and,
	// with ThenWait, puts it back whenever that file loses it);
	// RemoveClaimsEntry takes it out instead of installing.
	ClaimsEntry       bool
	RemoveClaimsEntry bool
	CNIConfDir        string
}

// FlagSet returns the flags of `rdma-netns install` bound to o, with the
// defaults set. Manifests that run the command are checked against it.
func FlagSet(o *Options) *flag.FlagSet {
	fl := flag.NewFlagSet("rdma-netns install", flag.ContinueOnError)
	fl.StringVar(&o.Dest, "dest", "/opt/cni/bin", "CNI bin `DIR` to install into (in a DaemonSet: where the host's directory is mounted)")
	fl.StringVar(&o.Name, "name", "rdma-netns", "file `NAME` in DIR: the plugin type the network configurations use")
	fl.BoolVar(&o.ThenWait, "then-wait", false, "after installing, sleep until SIGTERM or SIGINT")
	fl.StringVar(&o.NRI.Src, "nri", "", "also install the NRI plugin at `PATH` (/rdma-netns-nri in the image) into the runtime's NRI plugin directory")
	fl.StringVar(&o.NRI.PluginDir, "nri-plugin-dir", "/opt/nri/plugins", "the runtime's NRI plugin `DIR` (containerd: plugin_path; in a DaemonSet: where the host's is mounted)")
	fl.StringVar(&o.NRI.ConfDir, "nri-conf-dir", "/etc/nri/conf.d", "the runtime's NRI plugin configuration `DIR` (containerd: plugin_config_path)")
	fl.StringVar(&o.NRI.Index, "nri-index", "10", "the NRI plugin's two-digit index `NN`: its file is NN-rdma-netns-nri")
	fl.BoolVar(&o.ClaimsEntry, "claims-entry", false, "after installing, append the claims entry (pods' NICs by claim alone) to the node's primary network in --cni-conf-dir; with --then-wait, put it back whenever that file loses it")
	fl.BoolVar(&o.RemoveClaimsEntry, "remove-claims-entry", false, "take the claims entry out of the node's primary network, and install nothing")
	fl.StringVar(&o.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "the runtime's CNI configuration `DIR` (in a DaemonSet: where the host's is mounted)")
	return fl
}

// Main runs `rdma-netns install` with the arguments after "install" and
// returns the exit status: 0 installed, 1 failed, 2 usage error. version is
// the build's, for the log line.
func Main(args []string, version string, stdout, stderr io.Writer) int {
	var o Options
	fl := FlagSet(&o)
	cli.SetUsage(fl, usage, stderr)
	if code, ok := parse(fl, &o, args, stderr); !ok {
		return code
	}
	if o.Name == "" || strings.ContainsRune(o.Name, '/') || o.Name == "." || o.Name == ".." {
		fmt.Fprintf(stderr, "rdma-netns install: --name %q must be a plain file name\n", o.Name)
		return 2
	}
	if o.NRI.Src != "" && !nriIndex().MatchString(o.NRI.Index) {
		fmt.Fprintf(stderr, "rdma-netns install: --nri-index %q must be two digits\n", o.NRI.Index)
		return 2
	}
	if o.RemoveClaimsEntry {
		return removeClaimsEntry(o, stdout, stderr)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns install: cannot find this binary to copy: %v\n", err)
		return 1
	}
	cniVersions, err := Install(self, o.Dest, o.Name)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns install: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "installed %s (%s, CNI versions %s)\n", filepath.Join(o.Dest, o.Name), version, cniVersions)
	if o.NRI.Src != "" {
		settings, err := InstallNRI(o.NRI)
		if err != nil {
			fmt.Fprintf(stderr, "rdma-netns install: NRI plugin: %v\n", err)
			return 1
		}
		name := o.NRI.Index + "-" + nriBase
		fmt.Fprintf(stdout, "installed %s and %s (%s); the runtime runs it from its next start\n",
			filepath.Join(o.NRI.PluginDir, name), filepath.Join(o.NRI.ConfDir, name+".conf"), settings)
	}
	if o.ClaimsEntry {
		// Only now: the entry names the binary, and a chain naming a
		// missing plugin fails every pod of the node.
		if code := ensureClaimsEntry(o, stdout, stderr); code != 0 {
			return code
		}
	}
	if o.ThenWait {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if o.ClaimsEntry {
			keepClaimsEntry(ctx, o, stdout, stderr)
		}
		<-ctx.Done()
	}
	return 0
}

func ensureClaimsEntry(o Options, stdout, stderr io.Writer) int {
	path, changed, err := EnsureClaimsEntry(o.CNIConfDir, o.Name)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns install: the claims entry: %v\n", err)
		return 1
	}
	if changed {
		fmt.Fprintf(stdout, "appended the claims entry (type %s) to %s\n", o.Name, path)
	}
	return 0
}

func removeClaimsEntry(o Options, stdout, stderr io.Writer) int {
	path, changed, err := RemoveClaimsEntry(o.CNIConfDir, o.Name)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns install: the claims entry: %v\n", err)
		return 1
	}
	if changed {
		fmt.Fprintf(stdout, "took the claims entry out of %s\n", path)
	} else {
		fmt.Fprintf(stdout, "%s has no claims entry\n", path)
	}
	return 0
}

// claimsEntryRepair is how often keepClaimsEntry looks: a node's CNI may
// write its configuration again (its agent restarted), without the entry.
var claimsEntryRepair = 10 * time.Second

// keepClaimsEntry puts the entry back until ctx ends. A sandbox made
// while the entry is out gets none of its claims' NICs: the entry is what
// attaches them (the claim's containers are not yet refused then: left
// for the claim's CDI check).
func keepClaimsEntry(ctx context.Context, o Options, stdout, stderr io.Writer) {
	go func() {
		t := time.NewTicker(claimsEntryRepair)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				// Only beside the binary it names: an entry put back
				// without it would fail every pod of the node.
				if !executable(filepath.Join(o.Dest, o.Name)) {
					continue
				}
				ensureClaimsEntry(o, stdout, stderr)
			}
		}
	}()
}

// parse is cli.Parse (pkg/cli), except that the arguments after the
// flags are the NRI plugin's flags, so they need --nri.
func parse(fl *flag.FlagSet, o *Options, args []string, stderr io.Writer) (int, bool) {
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	o.NRI.Flags = fl.Args()
	if len(o.NRI.Flags) > 0 && o.NRI.Src == "" {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (arguments are the NRI plugin's flags, with --nri)\n", fl.Name(), fl.Arg(0))
		fl.Usage()
		return 2, false
	}
	return 0, true
}

// Install copies the executable src to dir/name atomically and returns the
// CNI versions the installed copy reported. On error dir/name is untouched
// and no temporary file is left behind.
func Install(src, dir, name string) (string, error) {
	if err := checkDir(dir); err != nil {
		return "", err
	}
	tmp, err := writeTemp(src, dir, name)
	if err != nil {
		return "", err
	}
	installed := false
	defer func() {
		if !installed {
			os.Remove(tmp)
		}
	}()
	version, err := checkRuns(tmp)
	if err != nil {
		return "", err
	}
	target := filepath.Join(dir, name)
	if err := os.Rename(tmp, target); err != nil {
		return "", fmt.Errorf("cannot rename %s to %s: %w; %s is unchanged", tmp, target, err, target)
	}
	installed = true
	// The rename is durable only once the directory is: without this a
	// crash of the node could bring back the old binary, or none.
	if err := syncDir(dir); err != nil {
		return "", fmt.Errorf("installed %s, but cannot sync directory %s: %w", target, dir, err)
	}
	return version, nil
}

func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("destination directory %s does not exist: mount the host's CNI bin directory there (hostPath /opt/cni/bin, or the runtime's bin_dir) or pass --dest", dir)
	case err != nil:
		return fmt.Errorf("cannot use destination directory %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("destination %s is not a directory: --dest names the CNI bin directory, not the binary", dir)
	}
	return nil
}

// writeTemp copies src to a new file in dir and syncs it. The name starts
// with a dot so that nothing listing plugins mistakes it for one.
func writeTemp(src, dir, name string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("cannot read this binary at %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.CreateTemp(dir, "."+name+".install-*")
	if err != nil {
		return "", fmt.Errorf("cannot create a file in %s: %w%s", dir, err, hint(err))
	}
	tmp := out.Name()
	fail := func(what string, err error) (string, error) {
		out.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("cannot %s %s: %w%s", what, tmp, err, hint(err))
	}
	if _, err := io.Copy(out, in); err != nil {
		return fail("write", err)
	}
	if err := out.Chmod(0o755); err != nil {
		return fail("chmod", err)
	}
	if err := out.Sync(); err != nil {
		return fail("sync", err)
	}
	if err := out.Close(); err != nil {
		return fail("close", err)
	}
	return tmp, nil
}

// hint says what an operator can do about the usual errors of writing into
// a hostPath directory.
func hint(err error) string {
	switch {
	case errors.Is(err, syscall.EROFS):
		return ": the directory is mounted read-only; mount it read-write (volumeMounts readOnly: false)"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return ": run as the directory's owner (runAsUser: 0 for /opt/cni/bin)"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ": the filesystem is full"
	}
	return ""
}

// checkRuns executes the copy as a runtime would for CNI VERSION: a copy
// that cannot run here (noexec mount, wrong architecture, truncated file)
// must not replace one that can.
func checkRuns(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		why := "is the directory mounted noexec, or the image built for another architecture?"
		if ctx.Err() != nil {
			why = "it did not answer within 10s."
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return "", fmt.Errorf("the copy %s does not run CNI VERSION (%v): %s The installed binary is unchanged", path, err, why)
	}
	var info struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || len(info.SupportedVersions) == 0 {
		return "", fmt.Errorf("the copy %s answers CNI VERSION with %q, not a version list: is this binary a CNI plugin? The installed binary is unchanged", path, stdout.String())
	}
	return strings.Join(info.SupportedVersions, ", "), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// executable reports whether path is a regular file someone may run.
func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
