package nririg

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
)

// The runtime's NRI directories (containerd's plugin_path and
// plugin_config_path defaults), where rdma-netns install puts the plugin
// the runtime launches, and that copy's log.
const (
	NRIPluginDir = "/opt/nri/plugins"
	NRIConfDir   = "/etc/nri/conf.d"
	// Preinstalled is the copy containerd launches when it starts.
	Preinstalled = NRIPluginDir + "/10-rdma-netns-nri"
	// LaunchedLog is the log of the copy containerd launches.
	LaunchedLog Log = cririg.Dir + "/rdma-netns-nri-launched.log"
	// TaskDir holds the OCI bundles of the running containers.
	TaskDir = "/run/containerd/io.containerd.runtime.v2.task/" + cririg.Namespace
	// The adjusted-by annotations of the two instances.
	ByLaunched  = "10-rdma-netns-nri"
	ByDaemonSet = "50-rdma-netns"
)

// Install runs `rdma-netns install --nri` as the DaemonSet's init
// container does (its CNI copy goes to a directory of the rig's, the
// suite's /opt/cni/bin stays as it is), with the DaemonSet's flags plus
// a log file and debug level for the launched copy, and returns its
// output.
func Install() (string, error) {
	dest := filepath.Join(cririg.Dir, "install-cni-bin")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return "", err
	}
	out, err := exec.Command(cririg.CNIBinDir+"/rdma-netns", "install", "--dest", dest,
		"--nri", PluginBin, "--nri-plugin-dir", NRIPluginDir, "--nri-conf-dir", NRIConfDir,
		"--", "--memlock", "unlimited", "--shm-size", "1Gi", "--log-level", "debug", "--log-file", string(LaunchedLog)).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rdma-netns install --nri: %v: %s", err, out)
	}
	return string(out), nil
}

// Uninstall removes the pre-installed copy and its configuration: the
// runtime stops launching it from its next start.
func Uninstall() {
	os.Remove(Preinstalled)
	os.Remove(filepath.Join(NRIConfDir, "10-rdma-netns-nri.conf"))
}

// LaunchedPids are the pids of the copies the runtime launched (argv[0]
// is the path it ran).
func LaunchedPids() []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(data), "\x00")
		if argv0 == Preinstalled {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// AdjustedBy is the instance that adjusted the container, from its OCI
// spec's annotation ("" when none did).
func AdjustedBy(c *cririg.Container) (string, error) {
	data, err := os.ReadFile(filepath.Join(TaskDir, c.ID, "config.json"))
	if err != nil {
		return "", err
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", err
	}
	by := spec.Annotations["rdma-netns.io/nri-adjusted-by"]
	name, _, _ := strings.Cut(by, ",")
	return name, nil
}

var logTime = regexp.MustCompile(`^time="([^"]+)"`)

// PluginStartup is how long containerd, in its log after its last start
// (cririg's marker line), spent from "starting plugins" to the end of the
// pre-installed plugins' synchronization or failure, and the lines it
// logged about them.
func PluginStartup(ctd *cririg.Containerd) (time.Duration, []string, error) {
	data, err := os.ReadFile(ctd.Opts.Log)
	if err != nil {
		return 0, nil, err
	}
	log := string(data)
	if i := strings.LastIndex(log, "=== cririg: containerd starting"); i >= 0 {
		log = log[i:]
	}
	var first, last time.Time
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "starting plugins...") && !strings.Contains(l, "pre-installed NRI plugin") {
			continue
		}
		lines = append(lines, l)
		m := logTime.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		if first.IsZero() {
			first = t
		}
		last = t
	}
	if first.IsZero() {
		return 0, lines, fmt.Errorf("containerd's log has no NRI plugin start since its last start")
	}
	return last.Sub(first), lines, nil
}
