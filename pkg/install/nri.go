package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// NRI is where `rdma-netns install` puts the NRI plugin, so that the
// container runtime starts it itself, before it serves any container,
// whenever it starts (containerd's plugin_path and plugin_config_path).
type NRI struct {
	Src       string   // the rdma-netns-nri binary to install
	PluginDir string   // the runtime's NRI plugin directory
	ConfDir   string   // the runtime's NRI plugin configuration directory
	Index     string   // two digits: the plugin's order among the runtime's
	Flags     []string // the plugin's flags, written as its configuration
}

// nriBase is the plugin's name after its index (IDX-rdma-netns-nri).
const nriBase = "rdma-netns-nri"

// NRIConfigOK starts the line the plugin prints for a good configuration
// (nriplugin.ConfigOK; the CNI binary does not link the plugin).
const NRIConfigOK = "rdma-netns-nri: configuration ok:"

// The patterns are compiled on first use: this package is linked into the
// CNI binary, and every ADD and DEL would compile them at start-up.
var (
	nriIndex  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]{2}$`) })
	ourPlugin = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]{2}-` + nriBase + `$`) })
)

// InstallNRI installs n.Src as PluginDir/IDX-rdma-netns-nri and its flags
// as ConfDir/IDX-rdma-netns-nri.conf, each atomically (a temporary file,
// synced, renamed), after the copy has checked the configuration: a copy
// that does not run here, or flags it rejects, change nothing. Copies of
// ours under another index are removed, so that the runtime never
// launches two. It returns what the copy says the configuration sets.
func InstallNRI(n NRI) (string, error) {
	if !nriIndex().MatchString(n.Index) {
		return "", fmt.Errorf("--nri-index %q must be two digits", n.Index)
	}
	for _, dir := range []string{n.PluginDir, n.ConfDir} {
		// A node without NRI plugins has neither directory yet.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("cannot create %s: %w%s", dir, err, hint(err))
		}
	}
	name := n.Index + "-" + nriBase
	bin, err := writeTemp(n.Src, n.PluginDir, name)
	if err != nil {
		return "", err
	}
	conf, err := writeConf(n.ConfDir, name, n.Flags)
	if err != nil {
		os.Remove(bin)
		return "", err
	}
	done := false
	defer func() {
		if !done {
			os.Remove(bin)
			os.Remove(conf)
		}
	}()
	settings, err := checkConfig(bin, conf)
	if err != nil {
		return "", err
	}
	// The configuration first: a runtime starting in between launches
	// the old binary with the new flags, which it checked too.
	confPath := filepath.Join(n.ConfDir, name+".conf")
	if err := os.Rename(conf, confPath); err != nil {
		return "", fmt.Errorf("cannot rename %s to %s: %w; nothing changed", conf, confPath, err)
	}
	binPath := filepath.Join(n.PluginDir, name)
	if err := os.Rename(bin, binPath); err != nil {
		return "", fmt.Errorf("cannot rename %s to %s: %w; %s is unchanged", bin, binPath, err, binPath)
	}
	done = true
	if err := removeOthers(n.PluginDir, n.ConfDir, name); err != nil {
		return "", err
	}
	for _, dir := range []string{n.ConfDir, n.PluginDir} {
		if err := syncDir(dir); err != nil {
			return "", fmt.Errorf("installed %s, but cannot sync directory %s: %w", binPath, dir, err)
		}
	}
	return settings, nil
}

// writeConf writes the plugin's flags, one per line, to a temporary file
// in dir. The runtime hands the file's content to the plugin it launches.
func writeConf(dir, name string, flags []string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# rdma-netns-nri's flags when the runtime launches %s (written by rdma-netns install)\n", name)
	for _, f := range flags {
		b.WriteString(f + "\n")
	}
	f, err := os.CreateTemp(dir, "."+name+".conf.install-*")
	if err != nil {
		return "", fmt.Errorf("cannot create a file in %s: %w%s", dir, err, hint(err))
	}
	_, err = f.WriteString(b.String())
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("cannot write %s: %w%s", f.Name(), err, hint(err))
	}
	return f.Name(), nil
}

// checkConfig runs the copy on the configuration, as the runtime will
// hand it over: it proves the copy runs on this node and accepts it.
func checkConfig(bin, conf string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--check-config", conf)
	cmd.Env = []string{}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	msg := strings.TrimSpace(out.String())
	switch {
	case err != nil && ctx.Err() != nil:
		return "", fmt.Errorf("the copy %s did not answer --check-config within 10s; nothing changed", bin)
	case err != nil && msg == "":
		return "", fmt.Errorf("the copy %s does not run (%v): is the directory mounted noexec, or the image built for another architecture? Nothing changed", bin, err)
	case err != nil:
		return "", fmt.Errorf("the NRI plugin rejects its flags: %s; fix the flags after `--`. Nothing changed", msg)
	case !strings.HasPrefix(msg, NRIConfigOK):
		return "", fmt.Errorf("the copy %s answers --check-config with %q: is it rdma-netns-nri? Nothing changed", bin, msg)
	}
	return strings.TrimSpace(strings.TrimPrefix(msg, NRIConfigOK)), nil
}

// removeOthers removes our plugin under any other index, and its
// configuration: two launched copies would both adjust every container.
func removeOthers(pluginDir, confDir, keep string) error {
	des, err := os.ReadDir(pluginDir)
	if err != nil {
		return fmt.Errorf("cannot list %s: %w", pluginDir, err)
	}
	for _, de := range des {
		if de.Name() == keep || !ourPlugin().MatchString(de.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(pluginDir, de.Name())); err != nil {
			return fmt.Errorf("cannot remove the copy under another index %s: %w", filepath.Join(pluginDir, de.Name()), err)
		}
		os.Remove(filepath.Join(confDir, de.Name()+".conf"))
	}
	return nil
}
