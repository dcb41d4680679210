package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// claimNetworkPrefix starts the network name under which a claim's NIC is
// attached: "claim-" and the claim's UID. DEL finds a sandbox's claim
// attachments among the records by it.
const claimNetworkPrefix = "claim-"

// Self runs one verb of rdma-netns itself, in dra mode, for one NIC of a
// claim: a process of its own per NIC, so that each takes the locks and
// writes the records an attachment through a NAD would.
type Self interface {
	// Add returns the attachment's result: the NIC as the pod has it.
	Add(ctx context.Context, args *skel.CmdArgs) (types.Result, error)
	Del(ctx context.Context, args *skel.CmdArgs) error
}

// execSelf runs this binary with the CNI environment of args.
type execSelf struct{}

func selfArgs(verb string, args *skel.CmdArgs) (string, *invoke.Args, error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("finding rdma-netns's own binary: %v", err)
	}
	return self, &invoke.Args{Command: verb, ContainerID: args.ContainerID, NetNS: args.Netns,
		PluginArgsStr: args.Args, IfName: args.IfName, Path: os.Getenv("CNI_PATH")}, nil
}

func (execSelf) Add(ctx context.Context, args *skel.CmdArgs) (types.Result, error) {
	self, rargs, err := selfArgs("ADD", args)
	if err != nil {
		return nil, err
	}
	return invoke.ExecPluginWithResult(ctx, self, args.StdinData, rargs, nil)
}

func (execSelf) Del(ctx context.Context, args *skel.CmdArgs) error {
	self, rargs, err := selfArgs("DEL", args)
	if err != nil {
		return err
	}
	return invoke.ExecPluginWithoutResult(ctx, self, args.StdinData, rargs, nil)
}

func (p *Plugin) self() Self {
	if p.Self != nil {
		return p.Self
	}
	return execSelf{}
}

// addClaims is ADD of a "claims" entry, which sits after the primary
// plugin in the node's primary network: it attaches every NIC of the
// pod's claims that were prepared to be attached here (their claim or
// class configures the driver: drarecord.Claim.Attach), each as dra mode
// attaches a NIC a NAD names, under its claim's names, then passes the
// primary network's result on. A pod that holds no such claim is passed
// through untouched. If one NIC cannot be attached, those attached
// before it are taken back and the pod's sandbox fails: no pod runs
// without every NIC its claims were given. The result passed on gains
// each NIC as its attachment gave it (withClaimed).
func (c *call) addClaims() error {
	uid := c.conf.Pod.UID
	if uid == "" {
		c.log.Debugf("claims: no K8S_POD_UID in CNI_ARGS (not a Kubernetes pod): nothing to attach")
		return c.printResult()
	}
	if err := drarecord.CheckPodUID(uid); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS K8S_POD_UID: %v; nothing was changed", err), "")
	}
	nics, err := c.claimNICs(uid)
	if err != nil {
		return err
	}
	if len(nics) == 0 {
		return c.printResult()
	}
	ctx := context.Background()
	var done []*skel.CmdArgs
	var results []types.Result
	for _, n := range nics {
		res, err := c.p.self().Add(ctx, n.args)
		if err != nil {
			return c.undoClaims(ctx, done, fmt.Errorf("pod %s: claim %s/%s, request %s: NIC %s could not be attached as %s: %v",
				c.podName(), n.claim.ClaimNamespace, n.claim.ClaimName, config.Quote(n.dev.Request), n.dev.PCIAddress, n.args.IfName, err))
		}
		c.log.Infof("claims: claim %s/%s, request %s: NIC %s attached as %s", n.claim.ClaimNamespace, n.claim.ClaimName, config.Quote(n.dev.Request), n.dev.PCIAddress, n.args.IfName)
		done = append(done, n.args)
		results = append(results, res)
	}
	if err := c.withClaimed(results); err != nil {
		return c.undoClaims(ctx, done, fmt.Errorf("pod %s: %v", c.podName(), err))
	}
	return c.printResult()
}

// withClaimed makes the result the entry passes on the primary network's
// with each claimed NIC's interfaces and addresses after its own. The
// runtime keeps taking the pod's IP from the primary interface (eth0),
// and Multus's network-status lists every interface of the cluster
// network's result that is in the pod, so the claimed NICs show there
// under the cluster network's name. Routes and DNS stay the primary's:
// a NIC's routes are the pod's own (its claim's), not the pod's way out.
func (c *call) withClaimed(results []types.Result) error {
	out := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if c.conf.Result != nil {
		r, err := current.NewResultFromResult(c.conf.Result)
		if err != nil {
			return fmt.Errorf("cannot read the primary network's result: %v", err)
		}
		out = r
	}
	for _, res := range results {
		r, err := current.NewResultFromResult(res)
		if err != nil {
			return fmt.Errorf("cannot read a claimed NIC's result: %v", err)
		}
		off := len(out.Interfaces)
		out.Interfaces = append(out.Interfaces, r.Interfaces...)
		for _, ip := range r.IPs {
			ip := *ip
			if ip.Interface != nil {
				ip.Interface = current.Int(*ip.Interface + off)
			}
			out.IPs = append(out.IPs, &ip)
		}
	}
	return c.conf.SetPrevResult(out)
}

// undoClaims takes back, last first, the NICs this ADD attached, and
// returns err with what could not be taken back.
func (c *call) undoClaims(ctx context.Context, done []*skel.CmdArgs, err error) error {
	for i := len(done) - 1; i >= 0; i-- {
		if derr := c.p.self().Del(ctx, done[i]); derr != nil {
			c.log.Errorf("rollback: %s: %v", done[i].IfName, derr)
			err = fmt.Errorf("%v; taking %s back failed too: %v (the runtime's DEL retries)", err, done[i].IfName, derr)
			continue
		}
		c.log.Infof("rollback: %s taken back", done[i].IfName)
	}
	return err
}

// claimNIC is one NIC a "claims" entry attaches, and the dra-mode call
// that attaches it.
type claimNIC struct {
	claim *drarecord.Claim
	dev   drarecord.Device
	args  *skel.CmdArgs
}

// claimNICs is every NIC of the pod's claims prepared to be attached by
// the entry, in the pod's order (drarecord.Dir.PodDevices). A damaged
// record is no one's: it blocks no pod (the doctor names it).
func (c *call) claimNICs(uid string) ([]claimNIC, error) {
	devs, claims, err := drarecord.Dir(c.p.DRARecordDir).PodDevices(uid)
	if err != nil {
		return nil, fmt.Errorf("cannot read the DRA driver's records: %v; nothing was changed", err)
	}
	var out []claimNIC
	for _, cl := range claims {
		if !cl.Attach {
			continue
		}
		for _, d := range cl.Devices {
			args, err := c.claimArgs(cl, d, devs)
			if err != nil {
				return nil, err
			}
			out = append(out, claimNIC{claim: cl, dev: d, args: args})
		}
	}
	return out, nil
}

// claimArgs is the dra-mode call that attaches dev of claim cl: the
// network "claim-<UID>", the device's request and its place among the
// pod's devices of that request (what dra mode's pick counts), and the
// names, QoS and addresses the claim's configuration resolved to.
func (c *call) claimArgs(cl *drarecord.Claim, dev drarecord.Device, all []drarecord.Device) (*skel.CmdArgs, error) {
	index := 0
	for _, d := range all {
		if d.PCIAddress == dev.PCIAddress {
			break
		}
		if d.Request == dev.Request {
			index++
		}
	}
	cfg := dev.Config
	if cfg == nil || cfg.InterfaceName == "" {
		return nil, fmt.Errorf("claim %s/%s's record gives NIC %s (request %s) no interface name: rdma-netns-dra resolves one at Prepare; unprepare the claim (delete the pod) to have it prepared again; nothing was changed",
			cl.ClaimNamespace, cl.ClaimName, dev.PCIAddress, config.Quote(dev.Request))
	}
	conf := map[string]any{
		"cniVersion": c.conf.CNIVersion,
		"name":       claimNetworkPrefix + cl.ClaimUID,
		"type":       "rdma-netns",
		"dra":        map[string]any{"request": dev.Request, "index": index},
	}
	if cfg.RdmaDevName != "" {
		conf["rdmaDevName"] = cfg.RdmaDevName
	}
	if cfg.RdmaQoS != nil {
		conf["rdmaQoS"] = cfg.RdmaQoS
	}
	if len(cfg.IPAM) > 0 {
		conf["ipam"] = json.RawMessage(cfg.IPAM)
	}
	c.passLogging(conf)
	stdin, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	return &skel.CmdArgs{
		ContainerID: c.args.ContainerID, Netns: c.args.Netns, IfName: cfg.InterfaceName,
		Args: c.args.Args, StdinData: bytes.TrimSpace(stdin),
	}, nil
}

// passLogging gives a NIC's own call the entry's log settings, so that
// every line of a pod's attach is in the one file.
func (c *call) passLogging(conf map[string]any) {
	if c.conf.LogLevel != "" {
		conf["logLevel"] = c.conf.LogLevel
	}
	if c.conf.LogFile != "" && !c.conf.ForeignLogFile() {
		conf["logFile"] = c.conf.LogFile
	}
}

// delClaims is DEL of a "claims" entry: every NIC attached for this
// sandbox under a claim's network is taken back, as dra mode's DEL does
// for a NAD's (it needs no claim record: a claim already unprepared, a
// node rebooted, lose nothing). Each is tried; DEL fails only when one
// could not be taken back, for the runtime to retry.
func (c *call) delClaims() error {
	if err := c.openStore(); err != nil {
		return err
	}
	recs, err := c.store.List()
	if err != nil {
		return fmt.Errorf("cannot read rdma-netns's records: %v; retry DEL", err)
	}
	var mine []*state.Record
	for _, r := range recs {
		if r.ContainerID == c.args.ContainerID && strings.HasPrefix(r.Network, claimNetworkPrefix) {
			mine = append(mine, r)
		}
	}
	if len(mine) == 0 {
		c.log.Debugf("claims: no claimed NIC attached to this sandbox")
		return nil
	}
	c.log.Infof("claims: taking back %d claimed NIC(s) of the sandbox", len(mine))
	ctx := context.Background()
	var errs []error
	for _, r := range mine {
		args, err := c.claimDelArgs(r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := c.p.self().Del(ctx, args); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %v", r.IfName, r.PCIAddress, err))
			continue
		}
		c.log.Infof("claims: %s (%s) taken back from the pod", r.IfName, r.PCIAddress)
	}
	if len(errs) > 0 {
		return fmt.Errorf("claims: could not take back every claimed NIC of the pod: %w; retry DEL", errors.Join(errs...))
	}
	return nil
}

// claimDelArgs is the dra-mode DEL of the attachment r recorded, with the
// IPAM its claim's configuration gave when the claim's record still says
// (to release addresses if the pod's netns is gone).
func (c *call) claimDelArgs(r *state.Record) (*skel.CmdArgs, error) {
	conf := map[string]any{
		"cniVersion": c.conf.CNIVersion,
		"name":       r.Network,
		"type":       "rdma-netns",
		"dra":        map[string]any{},
	}
	c.passLogging(conf)
	uid := strings.TrimPrefix(r.Network, claimNetworkPrefix)
	if cl, ok, err := drarecord.Dir(c.p.DRARecordDir).Load(uid); err == nil && ok {
		for _, d := range cl.Devices {
			if d.PCIAddress == r.PCIAddress && d.Config != nil && len(d.Config.IPAM) > 0 {
				conf["ipam"] = json.RawMessage(d.Config.IPAM)
			}
		}
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	return &skel.CmdArgs{ContainerID: r.ContainerID, Netns: c.args.Netns, IfName: r.IfName, Args: c.args.Args, StdinData: stdin}, nil
}
