package nriplugin

import (
	"context"
	"errors"
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

const usage = `Usage: rdma-netns-nri [--socket PATH] [--memlock LIMIT] [--shm-size SIZE] [--max-shm-size SIZE] [--sandbox-root DIRS]
                      [--index NN] [--lock PATH] [--log-level LEVEL] [--log-file PATH]
       rdma-netns-nri --check-config FILE

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
  rdma-netns.io/shm-size: 16Gi     this pod's /dev/shm size ("keep": 64 MiB); a pod
                                   asking more than --max-shm-size is refused: its
                                   containers are not created, its events say why
When it connects it grows the /dev/shm of RDMA pods whose containers were
created while it was away, and logs each such container that lacks its
device nodes or memlock (they cannot be changed while they run).

Two ways to run it, never both at once on a node (a lock decides):
  - as a container or a service (the DaemonSet's): it connects to the NRI
    socket and reconnects whenever the runtime restarts;
  - pre-installed in the runtime's NRI plugin directory (/opt/nri/plugins/
    10-rdma-netns-nri, by rdma-netns install): the runtime starts it before
    it serves any container, hands it its connection, and gives it these
    flags from /etc/nri/conf.d/10-rdma-netns-nri.conf; it exits when the
    runtime closes the connection, and the runtime starts it again.
The instance that cannot take the lock stands by until it can.
Run as root on the node, in the host's network namespace (it enters pod
network namespaces).

Flags:
`

// Options are the plugin's command line.
type Options struct {
	Socket, Memlock, ShmSize, MaxShmSize, SandboxRoots, Index, LogLevel string
	// Lock is the file whose lock decides which instance serves.
	Lock string
	// LogFile is where the log goes; "" is stderr, except for a
	// runtime-launched plugin, whose stderr the runtime discards.
	LogFile string
	// CheckConfig: check this configuration file, as the runtime would
	// hand it to a launched plugin, say what it sets and exit.
	CheckConfig string
}

// FlagSet binds the plugin's flags to o, with their defaults.
func FlagSet(o *Options) *flag.FlagSet {
	fl := flag.NewFlagSet("rdma-netns-nri", flag.ContinueOnError)
	fl.StringVar(&o.Socket, "socket", api.DefaultSocketPath, "the runtime's NRI socket `PATH`")
	fl.StringVar(&o.Memlock, "memlock", "unlimited", "RLIMIT_MEMLOCK (soft and hard) of the containers: `LIMIT` unlimited, a Kubernetes quantity (64Gi, 1.5Gi, 2G, 1e9), or keep (the runtime's); a container that has at least that much keeps its own")
	fl.StringVar(&o.ShmSize, "shm-size", podadjust.FormatSize(podadjust.DefaultPolicy.ShmSize), "default `SIZE` of a pod's /dev/shm, a Kubernetes quantity (16Gi, 1.5Gi, 2G, 1e9), or keep (the runtime's 64Mi); capped at the pod's memory limit")
	fl.StringVar(&o.MaxShmSize, "max-shm-size", podadjust.FormatSize(podadjust.DefaultPolicy.MaxShmSize), "the most /dev/shm a pod may ask for with rdma-netns.io/shm-size, a Kubernetes quantity: a pod holding RDMA devices that asks more is refused (its containers are not created); at least --shm-size")
	fl.StringVar(&o.SandboxRoots, "sandbox-root", strings.Join(podadjust.DefaultPolicy.SandboxRoots, ","), "comma-separated `DIRS` where the runtime keeps a directory per pod sandbox holding the pod's shm tmpfs (containerd: <state>/io.containerd.grpc.v1.cri/sandboxes, CRI-O: <runroot>/overlay-containers); only a /dev/shm from there is resized")
	fl.StringVar(&o.Index, "index", "50", "the plugin's two-digit NRI index: `NN` orders it among the runtime's NRI plugins")
	fl.StringVar(&o.LogLevel, "log-level", "info", "`LEVEL` error, warn, info (one line per adjusted container) or debug (one per container)")
	fl.StringVar(&o.Lock, "lock", DefaultLock, "lock file `PATH`: of the runtime-launched and the DaemonSet's instance, the one holding it serves")
	fl.StringVar(&o.LogFile, "log-file", "", "append the log to `PATH` (default stderr; "+DefaultLaunchedLog+" when the runtime launched the plugin)")
	fl.StringVar(&o.CheckConfig, "check-config", "", "check `FILE`, the runtime's configuration of the launched plugin (/etc/nri/conf.d/10-rdma-netns-nri.conf), print what it sets and exit (rdma-netns install runs the installed copy so)")
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
	if p.MaxShmSize, err = podadjust.ParseMaxShmSize(o.MaxShmSize); err != nil {
		return p, fmt.Errorf("--max-shm-size: %v", err)
	}
	if p.ShmSize > p.MaxShmSize {
		return p, fmt.Errorf("--shm-size %s is above --max-shm-size %s: the node's default would be more than any pod may ask for; lower --shm-size or raise --max-shm-size",
			strings.TrimSpace(o.ShmSize), strings.TrimSpace(o.MaxShmSize))
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
	if o.Lock != "" && !filepath.IsAbs(o.Lock) {
		return p, fmt.Errorf("--lock %q must be an absolute path", o.Lock)
	}
	if o.LogFile != "" && !filepath.IsAbs(o.LogFile) {
		return p, fmt.Errorf("--log-file %q must be an absolute path", o.LogFile)
	}
	return p, nil
}

// Main runs the plugin until SIGINT or SIGTERM (or, when the runtime
// launched it, until the runtime closes the connection) and returns the
// exit status.
func Main(args []string, stderr io.Writer) int {
	var o Options
	if code, ok := cli.Parse(FlagSet(&o), usage, args, stderr); !ok {
		return code
	}
	policy, err := o.Policy()
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns-nri: %v\n", err)
		return 2
	}
	if o.CheckConfig != "" {
		return checkConfig(o.CheckConfig, stderr)
	}
	if o.Lock == "" {
		// Without the lock nothing keeps two instances from both
		// adjusting a container, which the runtime then fails.
		fmt.Fprintf(stderr, "rdma-netns-nri: --lock must name the lock file the other instance takes too\n")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if name, ok := launchedAs(); ok {
		return runLaunched(ctx, name, o, policy)
	}
	log := logging.NewWriter(stderr, o.LogLevel)
	if o.LogFile != "" {
		log = logging.New(o.LogFile, o.LogLevel, "")
	}
	p := newPlugin(policy, log, fmt.Sprintf("%s-rdma-netns, pid %d, connected to %s", o.Index, os.Getpid(), o.Socket))
	log.Infof("rdma-netns-nri: %s, NRI socket %s", settings(policy, o), o.Socket)
	if err := run(ctx, log, o.Lock, p.who, stubs(p, o.Socket, o.Index)); err != nil {
		log.Errorf("%v", err)
		return 1
	}
	return 0
}

// What the plugin asks (the kernel; whether a netns path opens, and is
// the host's) and resizes (the pods' tmpfs): the unit test of a
// runtime-launched plugin, a process of its own that the test cannot
// hand an Adjuster, swaps in fakes.
var (
	kernel       podadjust.Kernel = rdmans.Netlink{}
	shm          podadjust.Shm    = podadjust.Tmpfs{}
	visibleNetns                  = visible
	sameAsHost                    = sameAsSelf
)

func newPlugin(policy podadjust.Policy, log *logging.Logger, who string) *plugin {
	return &plugin{adj: &podadjust.Adjuster{Policy: policy, Kernel: kernel, Shm: shm, SameAsSelf: sameAsHost(), Visible: visibleNetns}, log: log, who: who}
}

func settings(policy podadjust.Policy, o Options) string {
	return fmt.Sprintf("memlock %s, /dev/shm %s (a pod may ask up to %s), sandbox roots %s, lock %s", policy.Memlock, shmString(policy.ShmSize),
		podadjust.FormatSize(policy.MaxShmSize), strings.Join(policy.SandboxRoots, ","), o.Lock)
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

// standbyPoll is how often an instance standing by tries the lock: a
// container created between the holder's end and the next try starts
// without the plugin, and the holder only ends when it crashes or the
// runtime stops (which creates no container).
const standbyPoll = time.Second

// run connects a new stub to the runtime and serves it until the
// connection ends, then does it again, until ctx is done. A stub is made
// per connection: the runtime forgets the plugin when it restarts, and a
// fresh registration (with its Synchronize) is what it expects. Only a
// stub that cannot be made at all, or a lock file that cannot be used, is
// an error.
//
// It serves only while it holds the lock at lockPath ("" for none):
// while the runtime-launched instance holds it, this one stands by. The
// lock is taken before connecting and let go when the connection ends,
// so that across a runtime restart the instance the runtime launches
// (before it opens its socket) finds it free.
func run(ctx context.Context, log *logging.Logger, lockPath, who string, newStub func(onClose func()) (stub.Stub, error)) error {
	delay := firstRetry
	standingBy := false
	for ctx.Err() == nil {
		var lk *serveLock
		if lockPath != "" {
			var holder string
			var err error
			if lk, holder, err = tryLock(lockPath, who); err != nil {
				return err
			}
			if lk == nil {
				if !standingBy {
					log.Infof("standing by: another rdma-netns-nri serves (%s holds %s); serving when it lets go", holder, lockPath)
					standingBy = true
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(standbyPoll):
				}
				continue
			}
			if standingBy {
				log.Infof("the other rdma-netns-nri let go of %s: serving", lockPath)
				standingBy = false
			}
		}
		up, err := serveOnce(ctx, log, newStub)
		lk.release()
		if err == nil || errors.Is(err, errNoStub) {
			return err
		}
		if up > maxRetry {
			delay = firstRetry // it had been up: retry soon
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

var errNoStub = errors.New("cannot set up the NRI plugin")

// serveOnce makes a stub, serves its connection until it ends and says
// how long it was up. The error is nil only when ctx ended it.
func serveOnce(ctx context.Context, log *logging.Logger, newStub func(onClose func()) (stub.Stub, error)) (time.Duration, error) {
	st, err := newStub(func() { log.Warnf("the runtime closed the NRI connection (restarting?)") })
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errNoStub, err)
	}
	connected := time.Now()
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	select {
	case <-ctx.Done():
		st.Stop()
		<-done
		return 0, nil
	case err = <-done:
	}
	if err == nil {
		err = errors.New("the connection ended")
	}
	return time.Since(connected), err
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
