package cririg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// Paths in the guest. The conf/containerd files land in DropInDir and
// /etc/cni/*.d (cri-setup.sh); everything the rig writes is under Dir.
const (
	Dir           = "/run/cririg"
	Socket        = "/run/containerd/containerd.sock"
	NRISocket     = "/var/run/nri/nri.sock"
	DropInDir     = "/etc/containerd/conf.d"
	CNIBinDir     = "/opt/cni/bin"
	SetupPath     = "/payload/cri-setup.sh"
	ContainerdBin = "/usr/local/bin/containerd"
	Ctr           = "/usr/local/bin/ctr"
	// Namespace is the containerd namespace of CRI's images and pods.
	Namespace = "k8s.io"
	// RecordsDir is where rdma-netns keeps its attachment records.
	RecordsDir = "/var/lib/cni/rdma-netns"
)

// Options say how to run containerd. The zero value is the suite's setup.
type Options struct {
	// Config is where Start writes containerd's main config
	// (default Dir/config.toml).
	Config string
	// Log is containerd's log file, appended to across restarts
	// (default Dir/containerd.log).
	Log string
	// CNIBinDir is containerd's CNI bin_dirs (default /opt/cni/bin;
	// TraceCNI returns a directory of wrappers to put here).
	CNIBinDir string
	// Extra is TOML appended to the main config: tables of its own (for
	// example an NRI plugin's settings), which must not repeat WriteConfig's.
	Extra string
}

func (o Options) withDefaults() Options {
	if o.Config == "" {
		o.Config = filepath.Join(Dir, "config.toml")
	}
	if o.Log == "" {
		o.Log = filepath.Join(Dir, "containerd.log")
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = CNIBinDir
	}
	return o
}

// Containerd is a running containerd and a CRI client of it.
type Containerd struct {
	Opts    Options
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
	// StartTime is how long containerd took to answer CRI after its start.
	StartTime time.Duration

	cmd  *exec.Cmd
	done chan struct{}
	conn *grpc.ClientConn
	log  *os.File
}

// WriteConfig writes containerd's main config for the test VM to o.Config.
// What a node's config has is in the drop-in it imports
// (conf/containerd/rdma-netns.toml); what is here is what the VM needs:
//   - runc's NoPivotRoot for every runtime handler: the guest root is an
//     initramfs, where pivot_root fails;
//   - the native snapshotter (containerd's root is a tmpfs);
//   - no AppArmor (the guest kernel has it, the guest has no parser);
//   - the pause image pinned to the one BuildImages made, so containerd
//     never tries to pull it;
//   - NRI on its default socket.
func WriteConfig(o Options) error {
	o = o.withDefaults()
	handlers, err := Handlers()
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
imports = [%q]

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = %q
`, filepath.Join(DropInDir, "*.toml"), Socket, PauseImage, o.CNIBinDir, NRISocket)
	for _, h := range append([]string{"runc"}, handlers...) {
		fmt.Fprintf(&b, "\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s.options]\n  NoPivotRoot = true\n", h)
	}
	if o.Extra != "" {
		b.WriteString("\n" + o.Extra + "\n")
	}
	if err := os.MkdirAll(filepath.Dir(o.Config), 0o755); err != nil {
		return err
	}
	return os.WriteFile(o.Config, []byte(b.String()), 0o644)
}

var runtimeTable = regexp.MustCompile(`(?m)^\s*\[plugins\.'io\.containerd\.cri\.v1\.runtime'\.containerd\.runtimes\.([A-Za-z0-9_-]+)\]`)

// Handlers are the runtime handlers the drop-ins in DropInDir declare
// (conf/containerd/rdma-netns.toml's: one per RDMA NIC), sorted.
func Handlers() ([]string, error) {
	files, err := filepath.Glob(filepath.Join(DropInDir, "*.toml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no containerd drop-in in %s: run cririg.Setup first", DropInDir)
	}
	var hs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range runtimeTable.FindAllSubmatch(data, -1) {
			hs = append(hs, string(m[1]))
		}
	}
	sort.Strings(hs)
	return hs, nil
}

// Start writes the config, starts containerd, waits until CRI answers and
// imports the images if containerd does not have them yet. Starting it
// again after Kill restarts it on the same state, as a node's would.
func Start(o Options) (*Containerd, error) {
	o = o.withDefaults()
	if err := WriteConfig(o); err != nil {
		return nil, fmt.Errorf("write containerd config: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(o.Log), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(o.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "=== cririg: containerd starting at %s\n", time.Now().Format(time.RFC3339Nano))
	started := time.Now()
	cmd := exec.Command(ContainerdBin, "--config", o.Config, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that a test's Ctrl-C or a signal to the
	// test binary does not reach it; Kill signals containerd alone (its
	// shims, which run the pods, are in sessions of their own anyway).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start containerd: %v", err)
	}
	c := &Containerd{Opts: o, cmd: cmd, done: make(chan struct{}), log: logf}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	if err := c.connect(60 * time.Second); err != nil {
		c.Kill()
		return nil, fmt.Errorf("%v\n%s", err, c.LogTail(30))
	}
	c.StartTime = time.Since(started)
	if err := c.ImportImages(context.Background()); err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}

func (c *Containerd) connect(timeout time.Duration) error {
	conn, err := grpc.NewClient("unix://"+Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	c.conn = conn
	c.Runtime = runtimeapi.NewRuntimeServiceClient(conn)
	c.Images = runtimeapi.NewImageServiceClient(conn)
	var last error
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-c.done:
			return errors.New("containerd exited while starting")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, last = c.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
		cancel()
		if last == nil {
			return nil
		}
	}
	return fmt.Errorf("containerd's CRI does not answer after %s: %v", timeout, last)
}

// Alive tells whether this containerd is still running.
func (c *Containerd) Alive() bool { return !rig.Closed(c.done) }

// Pid is containerd's process id.
func (c *Containerd) Pid() int { return c.cmd.Process.Pid }

// Stop stops containerd with SIGTERM (pods keep running, as on a node
// where the runtime is restarted) and waits for it to exit.
func (c *Containerd) Stop() error {
	return c.signal(syscall.SIGTERM, 30*time.Second)
}

// Kill SIGKILLs containerd, as the OOM killer or a crash would, and waits
// for it to be gone. CNI plugins it started keep running to their end.
func (c *Containerd) Kill() error {
	return c.signal(syscall.SIGKILL, 10*time.Second)
}

func (c *Containerd) signal(sig syscall.Signal, timeout time.Duration) error {
	// The client connection closes only once containerd is gone: closing
	// it first cancels the requests in flight, and containerd would kill
	// the CNI plugins of a RunPodSandbox it was running before the signal
	// arrives, which is another scenario than a crash.
	defer func() {
		if c.conn != nil {
			c.conn.Close()
		}
	}()
	_ = c.cmd.Process.Signal(sig)
	defer c.log.Close()
	select {
	case <-c.done:
		return nil
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("containerd did not exit within %s of %v", timeout, sig)
	}
}

// Restart kills containerd (SIGKILL) and starts it again with the same
// options, returning the new one.
func (c *Containerd) Restart() (*Containerd, error) {
	if err := c.Kill(); err != nil {
		return nil, err
	}
	return Start(c.Opts)
}

// LogTail is the last n lines of containerd's log, for failure messages.
func (c *Containerd) LogTail(n int) string {
	data, err := os.ReadFile(c.Opts.Log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "containerd log (last lines):\n" + strings.Join(lines, "\n")
}

// NetworkReady is CRI Status's NetworkReady condition: whether the default
// network's STATUS succeeded, and containerd's reason and message if not.
func (c *Containerd) NetworkReady(ctx context.Context) (ready bool, reason, message string, err error) {
	st, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return false, "", "", fmt.Errorf("CRI Status: %v", err)
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == runtimeapi.NetworkReady {
			return cond.Status, cond.Reason, cond.Message, nil
		}
	}
	return false, "", "", errors.New("CRI Status has no NetworkReady condition")
}
