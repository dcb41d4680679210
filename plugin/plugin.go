// Package plugin implements the rdma-netns CNI verbs.
//
// rdma-netns is a meta-plugin: it runs after a plugin that moved a netdev
// into the pod (host-device, sriov) and moves the RDMA device that belongs
// to that netdev along with it, so the pod's verbs applications see it when
// the kernel's RDMA subsystem is in exclusive netns mode.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/linkconf"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/roceqos"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Kernel is what the verbs need from the running kernel. Production uses
// rdmans.Netlink; unit tests substitute an in-memory kernel.
type Kernel interface {
	NetnsMode() (string, error)
	InHost(dev string) (bool, error)
	InNetns(nsPath, dev string) (bool, error)
	// MoveToNetns moves dev from the host into nsPath and returns its
	// kernel index; hint is an index dev had before (rdmans.NoIndex for
	// none), which the kernel must confirm before it is used.
	MoveToNetns(dev, nsPath string, hint uint32) (index uint32, err error)
	MoveToHost(dev, nsPath string) error
	// Release returns the device from nsPath under hostName, renaming it
	// back first when it carries podName there; found is false when the
	// pod has it under neither name. In the same visit to the pod it
	// readies the pod's NIC for host-device's DEL as nic asks
	// (rdmans.Netlink.RestoreNIC; the zero NIC asks nothing).
	Release(nsPath, hostName, podName string, nic rdmans.NIC) (found bool, fix rdmans.NICFix, err error)
	// VerbsNodesIn lists the RDMA devices in the netns at nsPath with
	// their uverbs nodes, and rdma_cm, as the kernel gives them there.
	VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error)
	// DeviceOfNetdev names the RDMA device in the netns at nsPath whose
	// port is bound to netdev ifName, "" if none.
	DeviceOfNetdev(nsPath, ifName string) (string, error)
	Rename(nsPath, from, to string) error
	// Netdev reads the netdev ifName in the netns at nsPath: the device
	// behind it and its alias.
	Netdev(nsPath, ifName string) (rdmans.Netdev, error)
	ApplyQoS(nsPath, dev string, s roceqos.Settings) error
	VerifyQoS(nsPath, dev string, s roceqos.Settings) error
	ClearQoS(dev string) error
}

// hostKernel is the running kernel: RDMA netlink plus rdma_cm configfs.
type hostKernel struct{ rdmans.Netlink }

func (hostKernel) ApplyQoS(nsPath, dev string, s roceqos.Settings) error {
	return roceqos.Apply(nsPath, dev, s)
}

func (hostKernel) VerifyQoS(nsPath, dev string, s roceqos.Settings) error {
	return roceqos.Verify(nsPath, dev, s)
}

func (hostKernel) ClearQoS(dev string) error { return roceqos.Remove(dev) }

// Plugin holds the kernel-facing parts of the verbs.
type Plugin struct {
	Kernel Kernel
	Sysfs  rdmadev.Sysfs
	// LockTimeout bounds the wait for the node-wide state lock.
	LockTimeout time.Duration
	// NewLogger builds the logger for one call; nil means per config.
	NewLogger func(conf *config.NetConf, args *skel.CmdArgs) *logging.Logger
	// Out receives the result; nil means stdout.
	Out io.Writer
	// Delegate runs host-device in dra mode; nil means the plugins in
	// CNI_PATH.
	Delegate Delegate
	// Links sets up a claimed NIC's IP configuration; nil means the
	// running kernel.
	Links Links
	// DRARecordDir is where dra mode reads the DRA driver's records; ""
	// means drarecord.DefaultDir, the node's directory. Only tests set
	// it: the records say which NICs are a pod's, so no runtime, NAD or
	// pod input chooses where they are read.
	DRARecordDir string
	// StateDir is where the plugin keeps its records; "" means
	// config.DefaultStateDir, the node's directory. Only tests set it: the
	// plugin runs as root, so no NAD chooses where it writes.
	StateDir string
	// Self runs rdma-netns's own verbs for each NIC a "claims" entry
	// attaches; nil means this binary, executed.
	Self Self
}

// stateDir is the node's record directory.
func (p *Plugin) stateDir() string {
	if p.StateDir != "" {
		return p.StateDir
	}
	return config.DefaultStateDir
}

// New returns the plugin wired to the running kernel.
func New() *Plugin {
	return &Plugin{Kernel: hostKernel{}, Sysfs: rdmadev.Sysfs{Root: "/sys"}, LockTimeout: 30 * time.Second}
}

// Funcs are the verbs for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

// call is the per-invocation context shared by the verbs.
type call struct {
	p     *Plugin
	args  *skel.CmdArgs
	conf  *config.NetConf
	log   *logging.Logger
	store *state.Store
	// hostDevs caches the host's RDMA devices for this call; nil until
	// read, and reset when the call renames a device in the host.
	hostDevs []rdmadev.Device
	// netnsID identifies CNI_NETNS on ADD.
	netnsID inventory.NetnsID
	// podLink is the pod's netdev as ADD read it, once (call.netdev).
	podLink *podLink
	// claimed is the NIC the pod's claim gave this attachment, in dra
	// mode's ADD.
	claimed *drarecord.Device
	// claim is the driver's record of the claim that holds claimed.
	claim *drarecord.Claim
	// hostLink is the claimed NIC's host IP configuration, read before
	// host-device moved it, for the record.
	hostLink *linkconf.Config
}

// newCall parses the configuration; withResult also converts prevResult,
// which only ADD and CHECK read.
func (p *Plugin) newCall(args *skel.CmdArgs, withResult bool) (*call, error) {
	parse := config.ParseSettings
	if withResult {
		parse = config.Parse
	}
	conf, err := parse(args.StdinData, args.Args)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	c := &call{p: p, args: args, conf: conf}
	if p.NewLogger != nil {
		c.log = p.NewLogger(conf, args)
	} else {
		c.log = logging.New(logFile(conf), conf.LogLevel, fmt.Sprintf("%s %.12s %s: ", conf.Name, args.ContainerID, logIfName(args.IfName)))
	}
	return c, nil
}

// logFile is the network's logFile when it names a file in the node's log
// directory, "" (stderr only) otherwise: the plugin runs as root, and a
// network must not choose which file of the node it appends to. ADD
// refuses such a network (nadLogFile); the other verbs run on.
func logFile(conf *config.NetConf) string {
	if conf.ForeignLogFile() {
		fmt.Fprintf(os.Stderr, "rdma-netns: logFile %s ignored: log files go in %s only\n", config.Quote(conf.LogFile), logging.Dir)
		return ""
	}
	return conf.LogFile
}

// logIfName is CNI_IFNAME as the log may show it: the pod chooses it, and
// a name ADD refuses (control characters, shell metacharacters, any length)
// is quoted and cut.
func logIfName(name string) string {
	if state.ValidatePlainIfName(name) == nil {
		return name
	}
	return config.Quote(name)
}

// key identifies this attachment in the state store.
func (c *call) key() state.Key {
	return state.Key{Network: c.conf.Name, ContainerID: c.args.ContainerID, IfName: c.args.IfName}
}

// openStore opens the state directory. Calls lock what they change:
// lockNode while they read the records and decide, lockDevice while they
// move a device and write its record.
func (c *call) openStore() error {
	if c.store != nil {
		// Opened already in this call: a DEL opens it for its own
		// record, then again to take the sandbox's claimed NICs back.
		return nil
	}
	st, err := state.New(c.p.stateDir())
	if err != nil {
		return fmt.Errorf("cannot use the state directory %s: %v; check that it is a directory the runtime (root) can write", c.p.stateDir(), err)
	}
	c.store = st
	return nil
}

// lockNode takes the node-wide lock, so two pods cannot both decide the
// same free device is theirs. It is never taken while a device lock is
// held (state.Store.LockDevice says why).
func (c *call) lockNode() (unlock func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.p.lockTimeout())
	defer cancel()
	release, err := c.store.Lock(ctx)
	if err != nil {
		return nil, err
	}
	return c.releaser("state lock", release), nil
}

// lockAttachment takes this attachment's lock for the whole call: ADD and
// DEL of one attachment follow one another as the runtime issued them.
func (c *call) lockAttachment() (unlock func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.p.lockTimeout())
	defer cancel()
	release, err := c.store.LockAttachment(ctx, c.key())
	if err != nil {
		return nil, fmt.Errorf("attachment %s: %v", c.key(), err)
	}
	return c.releaser("lock of attachment "+c.key().String(), release), nil
}

// lockDevice waits for the lock of the RDMA device named dev: held by
// whoever moves it or writes its record, so that calls on other devices
// run their kernel moves at the same time.
func (c *call) lockDevice(dev string) (unlock func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.p.lockTimeout())
	defer cancel()
	release, err := c.store.LockDevice(ctx, dev)
	if err != nil {
		return nil, fmt.Errorf("RDMA device %s: %v", dev, err)
	}
	return c.releaser("lock of RDMA device "+dev, release), nil
}

// tryLockDevice takes the lock of dev if no other call holds it.
func (c *call) tryLockDevice(dev string) (unlock func(), ok bool, err error) {
	release, ok, err := c.store.TryLockDevice(dev)
	if err != nil || !ok {
		return nil, false, err
	}
	return c.releaser("lock of RDMA device "+dev, release), true, nil
}

func (c *call) releaser(what string, release func() error) func() {
	return func() {
		if err := release(); err != nil {
			c.log.Warnf("releasing %s: %v", what, err)
		}
	}
}

func (p *Plugin) lockTimeout() time.Duration {
	if p.LockTimeout > 0 {
		return p.LockTimeout
	}
	return 30 * time.Second
}

// exclusive checks the subsystem's netns mode; the error explains why
// isolation is impossible in shared mode and how to fix it.
func (c *call) exclusive() error {
	mode, err := c.p.Kernel.NetnsMode()
	if err != nil {
		return fmt.Errorf("cannot read the RDMA netns mode: %v; check that the RDMA drivers (ib_core and the NIC's RDMA driver) are loaded on this node", err)
	}
	if mode != rdmans.ModeExclusive {
		return errSharedMode(mode)
	}
	return nil
}

func errSharedMode(mode string) error {
	return fmt.Errorf("the RDMA subsystem is in %s netns mode: every RDMA device is visible in every network namespace, so a device cannot be given to one pod. "+
		"Switch the node to exclusive mode: add \"options ib_core netns_mode=0\" to /etc/modprobe.d/ib_core.conf and reboot, "+
		"or run \"rdma system set netns exclusive\" before any network namespace exists (early at boot, before the container runtime starts). "+
		"To start pods without isolation instead, set \"allowSharedMode\": true in the rdma-netns config", mode)
}

// qos is the configured rdmaQoS, nil when unset.
func (c *call) qos() *roceqos.Settings {
	if q := c.conf.RdmaQoS; q != nil {
		return &roceqos.Settings{ToS: q.ToS, TC: q.TC}
	}
	return nil
}

// netnsGone reports whether the pod netns no longer exists, in which case
// the kernel has already returned its RDMA devices to the host.
func netnsGone(path string) bool {
	if path == "" {
		return true
	}
	netns, err := ns.GetNS(path)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		return errors.As(err, &notExist) || errors.As(err, &notNS)
	}
	netns.Close()
	return false
}
