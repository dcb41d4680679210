package nriplugin

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/rdma-netns/rdma-netns/pkg/cli"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

const usage = `Usage: rdma-netns-nri [--socket PATH] [--memlock LIMIT] [--shm-size SIZE] [--sandbox-root DIRS] [--index NN] [--log-level LEVEL]

An NRI plugin for containerd (>= 1.7; on by default in 2.x) and CRI-O
(>= 1.26, enable_nri). When the runtime creates a container in a pod whose
network namespace holds RDMA devices (rdma-netns moved them there), it adds
to the container: /dev/infiniband/uverbsN of exactly the pod's devices and
/dev/infiniband/rdma_cm, each allowed in the container's device cgroup; a
memlock limit (--memlock); and it grows the pod's /dev/shm, which all its
containers share, to --shm-size (never above the pod's memory limit).
Pods without an RDMA device, and every pod of a node not in exclusive RDMA
netns mode (where every netns sees every device), are never touched. Per pod:
  rdma-netns.io/nri: skip          leave every container of the pod alone
  rdma-netns.io/shm-size: 16Gi     this pod's /dev/shm size ("keep": 64 MiB)
Containers that exist when it connects are listed in the log, not changed.
It reconnects whenever the runtime restarts. Run as root on the node, in
the host's network namespace (it enters pod network namespaces).

Flags:
`

// Options are the plugin's command line.
type Options struct {
	Socket, Memlock, ShmSize, SandboxRoots, Index, LogLevel string
}

// FlagSet binds the plugin's flags to o, with their defaults.
func FlagSet(o *Options) *flag.FlagSet {
	fl := flag.NewFlagSet("rdma-netns-nri", flag.ContinueOnError)
	fl.StringVar(&o.Socket, "socket", api.DefaultSocketPath, "the runtime's NRI socket `PATH`")
	fl.StringVar(&o.Memlock, "memlock", "unlimited", "RLIMIT_MEMLOCK (soft and hard) of the containers: `LIMIT` unlimited, a Kubernetes quantity (64Gi, 1.5Gi, 2G, 1e9), or keep (the runtime's); a container that has at least that much keeps its own")
	fl.StringVar(&o.ShmSize, "shm-size", podadjust.FormatSize(podadjust.DefaultPolicy.ShmSize), "default `SIZE` of a pod's /dev/shm, a Kubernetes quantity (16Gi, 1.5Gi, 2G, 1e9), or keep (the runtime's 64Mi); capped at the pod's memory limit")
	fl.StringVar(&o.SandboxRoots, "sandbox-root", strings.Join(podadjust.DefaultPolicy.SandboxRoots, ","), "comma-separated `DIRS` where the runtime keeps a directory per pod sandbox holding the pod's shm tmpfs (containerd: <state>/io.containerd.grpc.v1.cri/sandboxes, CRI-O: <runroot>/overlay-containers); only a /dev/shm from there is resized")
	fl.StringVar(&o.Index, "index", "50", "the plugin's two-digit NRI index: `NN` orders it among the runtime's NRI plugins")
	fl.StringVar(&o.LogLevel, "log-level", "info", "`LEVEL` error, warn, info (one line per adjusted container) or debug (one per container)")
	return fl
}

// Policy checks the options and returns the node's policy.
func (o Options) Policy() (podadjust.Policy, error) {
	var p podadjust.Policy
	var err error
	if p.Memlock, err = podadjust.ParseMemlock(o.Memlock); err != nil {
		return p, fmt.Errorf("--memlock: %v", err)
	}
	if p.ShmSize, err = podadjust.ParseShmSize(o.ShmSize); err != nil {
		return p, fmt.Errorf("--shm-size: %v", err)
	}
	for _, root := range strings.Split(o.SandboxRoots, ",") {
		if !filepath.IsAbs(root) {
			return p, fmt.Errorf("--sandbox-root %q: want absolute paths, comma-separated", o.SandboxRoots)
		}
		p.SandboxRoots = append(p.SandboxRoots, filepath.Clean(root))
	}
	if _, err := logging.Level(o.LogLevel); err != nil {
		return p, fmt.Errorf("--log-level: %v", err)
	}
	if !regexp.MustCompile(`^[0-9]{2}$`).MatchString(o.Index) {
		return p, fmt.Errorf("--index %q must be two digits", o.Index)
	}
	if !filepath.IsAbs(o.Socket) {
		return p, fmt.Errorf("--socket %q must be an absolute path", o.Socket)
	}
	return p, nil
}

// Main runs the plugin until SIGINT or SIGTERM and returns the exit status.
func Main(args []string, stderr io.Writer) int {
	var o Options
	fl := FlagSet(&o)
	fl.SetOutput(stderr)
	fl.Usage = func() {
		fmt.Fprint(stderr, usage)
		fl.PrintDefaults()
	}
	if code, ok := cli.Parse(fl, args, stderr); !ok {
		return code
	}
	policy, err := o.Policy()
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns-nri: %v\n", err)
		return 2
	}
	log := logging.NewWriter(stderr, o.LogLevel)
	p := &plugin{adj: &podadjust.Adjuster{Policy: policy, Kernel: rdmans.Netlink{}, Shm: podadjust.Tmpfs{}, SameAsSelf: sameAsSelf(), Visible: visible}, log: log}
	log.Infof("rdma-netns-nri: memlock %s, /dev/shm %s, sandbox roots %s, NRI socket %s", policy.Memlock, shmString(policy.ShmSize), strings.Join(policy.SandboxRoots, ","), o.Socket)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, stubs(p, o.Socket, o.Index)); err != nil {
		log.Errorf("%v", err)
		return 1
	}
	return 0
}

// stubs makes the NRI stubs of plugin p, one per connection.
func stubs(p *plugin, socket, index string, extra ...stub.Option) func(onClose func()) (stub.Stub, error) {
	return func(onClose func()) (stub.Stub, error) {
		opts := []stub.Option{stub.WithPluginName("rdma-netns"), stub.WithPluginIdx(index),
			stub.WithSocketPath(socket), stub.WithLogger(nriLogger{p.log}), stub.WithOnClose(onClose)}
		return stub.New(p, append(opts, extra...)...)
	}
}

// Reconnection delays: the first retry is quick (a runtime restart takes
// about a second), later ones back off so that a node without the runtime
// is not polled in a tight loop.
const (
	firstRetry = 500 * time.Millisecond
	maxRetry   = 5 * time.Second
)

// run connects a new stub to the runtime and serves it until the
// connection ends, then does it again, until ctx is done. A stub is made
// per connection: the runtime forgets the plugin when it restarts, and a
// fresh registration (with its Synchronize) is what it expects. Only a
// stub that cannot be made at all is an error.
func run(ctx context.Context, log *logging.Logger, newStub func(onClose func()) (stub.Stub, error)) error {
	delay := firstRetry
	for ctx.Err() == nil {
		st, err := newStub(func() { log.Warnf("the runtime closed the NRI connection (restarting?); reconnecting") })
		if err != nil {
			return fmt.Errorf("cannot set up the NRI plugin: %v", err)
		}
		connected := time.Now()
		done := make(chan error, 1)
		go func() { done <- st.Run(ctx) }()
		select {
		case <-ctx.Done():
			st.Stop()
			<-done
			return nil
		case err = <-done:
		}
		if time.Since(connected) > maxRetry {
			delay = firstRetry // it had been up: retry soon
		}
		if err == nil {
			err = fmt.Errorf("the connection ended")
		}
		log.Warnf("not connected to the runtime's NRI socket: %v; retrying in %s", err, delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRetry)
	}
	return nil
}

func shmString(n uint64) string {
	if n == 0 {
		return podadjust.Keep
	}
	return podadjust.FormatSize(n)
}

// sameAsSelf tells a netns path that opens the plugin's own netns, the
// host's (the DaemonSet has hostNetwork). Not pid 1's: opening another
// process's namespace needs ptrace access to it, which the DaemonSet's
// container (SYS_ADMIN only) lacks for the host's init. A path, or the
// plugin's own netns, whose identity cannot be read is an error, which
// grants nothing.
func sameAsSelf() func(string) (bool, error) {
	return hostNetns("/proc/self/ns/net")
}

// hostNetns tells a netns path that opens one of the netns at hosts.
func hostNetns(hosts ...string) func(string) (bool, error) {
	var ids []inventory.NetnsID
	var idErr error
	for _, h := range hosts {
		id, err := inventory.Identify(h)
		if err != nil {
			idErr = fmt.Errorf("the host's network namespace: %v", err)
		}
		ids = append(ids, id)
	}
	return func(path string) (bool, error) {
		if idErr != nil {
			return false, idErr
		}
		id, err := inventory.Identify(path)
		if err != nil {
			return false, err
		}
		return slices.Contains(ids, id), nil
	}
}

// visible: the plugin can open path (the runtime's netns directory may
// not be mounted into the plugin's container).
func visible(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// nriLogger sends the NRI stub's own messages to our log.
type nriLogger struct{ l *logging.Logger }

func (n nriLogger) Debugf(_ context.Context, f string, a ...any) { n.l.Debugf("nri: "+f, a...) }
func (n nriLogger) Infof(_ context.Context, f string, a ...any)  { n.l.Debugf("nri: "+f, a...) }
func (n nriLogger) Warnf(_ context.Context, f string, a ...any)  { n.l.Warnf("nri: "+f, a...) }
func (n nriLogger) Errorf(_ context.Context, f string, a ...any) { n.l.Errorf("nri: "+f, a...) }
