// Package nririg runs rdma-netns-nri next to the test VM's containerd
// (e2e/cri/cririg), as the DaemonSet's container does, or installs it
// where containerd launches it itself (preinstalled.go), and makes the
// pods and containers its tests, its bench and the demo use: containers
// as unprivileged as a plain pod spec makes them, and what they have of
// what verbs needs, and which instance adjusted them. It only works
// inside the test VM, as root.
package nririg

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
)

const (
	// PluginBin is where build-payload.sh puts the plugin in the guest.
	PluginBin = "/usr/local/bin/rdma-netns-nri"
	// WorkloadUID is the uid the workloads run as: not root.
	WorkloadUID = 1000
)

// A Log is a log file of the plugin's. A test notes its Lines before what
// it does, then reads or waits for what the plugin logged Since.
type Log string

// PluginLog collects the log of the plugin StartPlugin runs, across its
// restarts.
const PluginLog Log = cririg.Dir + "/rdma-netns-nri.log"

// Lines counts the log's lines so far.
func (l Log) Lines() int {
	data, _ := os.ReadFile(string(l))
	return strings.Count(string(data), "\n")
}

// Since is the log after its first skip lines.
func (l Log) Since(skip int) string {
	data, _ := os.ReadFile(string(l))
	lines := strings.SplitAfter(string(data), "\n")
	if skip > len(lines) {
		return ""
	}
	return strings.Join(lines[skip:], "")
}

// Wait waits for a line containing s after the first skip lines.
func (l Log) Wait(skip int, s string, timeout time.Duration) error {
	return cririg.Wait(timeout, string(l)+" has a line with "+strconv.Quote(s), func() (bool, error) {
		return strings.Contains(l.Since(skip), s), nil
	})
}

// Plugin is rdma-netns-nri running as the DaemonSet runs it.
type Plugin struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// StartPlugin starts the plugin with the DaemonSet's flags and waits until
// containerd has synchronized it.
func StartPlugin() (*Plugin, error) {
	return StartPluginUntil("at connection")
}

// StartPluginUntil starts the plugin with the DaemonSet's flags and waits
// until its log says s ("standing by" while a pre-installed copy serves).
func StartPluginUntil(s string) (*Plugin, error) {
	before := PluginLog.Lines()
	f, err := os.OpenFile(string(PluginLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(PluginBin, "--socket", cririg.NRISocket, "--memlock", "unlimited", "--shm-size", "1Gi", "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Plugin{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	if err := PluginLog.Wait(before, s, 30*time.Second); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// Kill SIGKILLs the plugin and waits for it to be gone.
func (p *Plugin) Kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// Stop stops the plugin with SIGTERM, as a pod deletion does.
func (p *Plugin) Stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Unprivileged is a container as a plain pod spec makes it: no device
// (unless given here, as by hand), every capability dropped, no volume,
// not root, read-only root file system.
func Unprivileged(name string, devices ...string) cririg.ContainerSpec {
	uid := int64(WorkloadUID)
	return cririg.ContainerSpec{Name: name, Devices: devices, DropCaps: []string{"ALL"}, RunAsUser: &uid, NoNewPrivs: true, ReadonlyRootfs: true}
}

// What is what a container has of the three things verbs needs.
type What struct {
	Nodes   []string // /dev/infiniband
	Memlock string   // ulimit -l
	ShmKiB  int      // /dev/shm size
	CapEff  string
}

// Inspect asks the container what it has.
func Inspect(ctx context.Context, ctd *cririg.Containerd, c *cririg.Container) (What, error) {
	r, err := ctd.Exec(ctx, c, time.Minute, "sh", "-c",
		`echo nodes: $(ls /dev/infiniband 2>/dev/null); ulimit -l; df -k /dev/shm | tail -1; grep CapEff /proc/self/status`)
	if err != nil {
		return What{}, err
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 4 {
		return What{}, fmt.Errorf("unexpected output:\n%s", r.Stdout)
	}
	var w What
	w.Nodes = strings.Fields(strings.TrimPrefix(lines[0], "nodes:"))
	w.Memlock = strings.TrimSpace(lines[1])
	if f := strings.Fields(lines[2]); len(f) > 1 {
		w.ShmKiB, _ = strconv.Atoi(f[1])
	}
	w.CapEff = strings.TrimSpace(strings.TrimPrefix(lines[3], "CapEff:"))
	return w, nil
}
