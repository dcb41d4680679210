package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// hostDevice is the plugin that moves the NIC in dra mode.
const hostDevice = "host-device"

// draDeviceClass is the DeviceClass the chart installs for the driver's
// NICs; errors name it so a pod author knows what to claim.
const draDeviceClass = "rdma-nic.rdma-netns.io"

// Delegate runs another CNI plugin for this call, with this call's
// CNI_* environment and the verb it is named for.
type Delegate interface {
	Add(ctx context.Context, plugin string, conf []byte) (types.Result, error)
	Del(ctx context.Context, plugin string, conf []byte) error
}

// execDelegate finds the plugin in CNI_PATH and executes it.
type execDelegate struct{}

func (execDelegate) Add(ctx context.Context, plugin string, conf []byte) (types.Result, error) {
	return invoke.DelegateAdd(ctx, plugin, conf, nil)
}

func (execDelegate) Del(ctx context.Context, plugin string, conf []byte) error {
	return invoke.DelegateDel(ctx, plugin, conf, nil)
}

// delegateConf is the configuration rdma-netns gives host-device in dra
// mode: only what names the NIC and its addresses. Of the runtime's
// settings only the pod's addresses (the "ips" capability, for static
// IPAM) are passed on, and only to ADD (pci set): a runtimeConfig.deviceID
// would override the claim's NIC in host-device, and no IPAM needs the
// pod's addresses to release them, while one that parses them (host-local)
// would fail DEL on what the pod wrote.
type delegateConf struct {
	CNIVersion    string          `json:"cniVersion"`
	Name          string          `json:"name"`
	Type          string          `json:"type"`
	PCIBusID      string          `json:"pciBusID,omitempty"`
	Device        string          `json:"device,omitempty"`
	IPAM          json.RawMessage `json:"ipam,omitempty"`
	Capabilities  map[string]bool `json:"capabilities,omitempty"`
	RuntimeConfig *delegateRC     `json:"runtimeConfig,omitempty"`
}

type delegateRC struct {
	IPs json.RawMessage `json:"ips"`
}

func (c *call) delegateConf(pci, device string) []byte {
	d := delegateConf{
		CNIVersion: c.conf.CNIVersion, Name: c.conf.Name, Type: hostDevice,
		PCIBusID: pci, Device: device, IPAM: c.conf.IPAM,
	}
	if ips := c.conf.RuntimeConfig.IPs; pci != "" && len(ips) > 0 && c.conf.Capabilities["ips"] {
		d.Capabilities = map[string]bool{"ips": true}
		d.RuntimeConfig = &delegateRC{IPs: ips}
	}
	b, _ := json.Marshal(d)
	return b
}

// draConflict refuses a dra network whose configuration also names a
// device: the claim decides which NIC the pod gets, and two answers
// cannot both hold. Multus writes deviceID and pciBusID into the config
// of a network with a resourceName annotation.
func (c *call) draConflict() error {
	var set []string
	for _, f := range []struct{ name, val string }{
		{"rdmaDevice", c.conf.RdmaDevice}, {"deviceID", c.conf.DeviceID}, {"pciBusID", c.conf.PCIBusID},
	} {
		if f.val != "" {
			set = append(set, f.name)
		}
	}
	if len(c.conf.AllowedPodDevices) > 0 {
		set = append(set, "allowedPodDevices")
	}
	if len(set) == 0 {
		return nil
	}
	return fmt.Errorf("network %s has \"dra\", so the pod's ResourceClaim picks its NIC, but its configuration also sets %s (a resourceName annotation on the NetworkAttachmentDefinition has Multus set deviceID and pciBusID); remove one of them; nothing was changed",
		config.Quote(c.conf.Name), strings.Join(set, ", "))
}

// claimedNIC is the NIC the driver prepared for this pod that this
// attachment takes. K8S_POD_UID is checked before any record is read.
func (c *call) claimedNIC() (drarecord.Device, error) {
	uid := c.conf.Pod.UID
	if uid == "" {
		return drarecord.Device{}, types.NewError(types.ErrInvalidEnvironmentVariables,
			"dra mode needs K8S_POD_UID, which Multus passes, in CNI_ARGS to find the pod's NICs; nothing was changed", "")
	}
	if err := drarecord.CheckPodUID(uid); err != nil {
		return drarecord.Device{}, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_ARGS K8S_POD_UID: %v; nothing was changed", err), "")
	}
	request, index, err := c.conf.DRAPick()
	if err != nil {
		return drarecord.Device{}, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	if err := c.nadRecordDir(); err != nil {
		return drarecord.Device{}, types.NewError(types.ErrInvalidNetworkConfig, err.Error()+"; nothing was changed", "")
	}
	devs, claims, err := drarecord.Dir(c.p.DRARecordDir).PodDevices(uid)
	if err != nil {
		return drarecord.Device{}, fmt.Errorf("cannot read the DRA driver's records: %v; nothing was changed", err)
	}
	if len(devs) == 0 {
		return drarecord.Device{}, fmt.Errorf("pod %s has no NIC prepared by driver %s on this node: its claims were not prepared here, or it holds no ResourceClaim of DeviceClass %s, which network %s needs; nothing was changed",
			c.podName(), drarecord.DriverName, draDeviceClass, config.Quote(c.conf.Name))
	}
	dev, err := drarecord.Pick(devs, request, index)
	if err != nil {
		return drarecord.Device{}, fmt.Errorf("pod %s: %v; nothing was changed", c.podName(), err)
	}
	// The claims entry attaches such a claim's NICs under the network
	// "claim-<UID>"; any other network would attach them a second time.
	if cl := claimOf(claims, dev); cl != nil && cl.Attach && c.conf.Name != claimNetworkPrefix+cl.ClaimUID {
		return drarecord.Device{}, fmt.Errorf("pod %s: claim %s/%s configures driver %s, so it gives its NICs to the pod by itself (the \"claims\" entry of the node's primary network), and network %s would attach NIC %s a second time; remove the network from the pod's networks, or the configuration from the claim; nothing was changed",
			c.podName(), cl.ClaimNamespace, cl.ClaimName, drarecord.DriverName, config.Quote(c.conf.Name), dev.PCIAddress)
	}
	if !rdmadev.IsPCIAddress(dev.PCIAddress) {
		return drarecord.Device{}, fmt.Errorf("the DRA driver's record of pod %s gives request %s the PCI address %s, which is not one (domain:bus:device.function); nothing was changed",
			c.podName(), config.Quote(dev.Request), config.Quote(dev.PCIAddress))
	}
	c.claim = claimOf(claims, dev)
	c.log.Infof("the pod's NIC for this attachment is %s (request %s, device %s of pool %s)", dev.PCIAddress, config.Quote(dev.Request), config.Quote(dev.Device), config.Quote(dev.Pool))
	return dev, nil
}

// claimOf is the claim among claims that holds dev.
func claimOf(claims []*drarecord.Claim, dev drarecord.Device) *drarecord.Claim {
	for _, cl := range claims {
		for _, d := range cl.Devices {
			if d.PCIAddress == dev.PCIAddress {
				return cl
			}
		}
	}
	return nil
}

// podName names the pod in errors: its namespace and name when the
// runtime gave them, its UID otherwise.
func (c *call) podName() string {
	if p := c.conf.Pod; p.Name != "" {
		return p.Namespace + "/" + p.Name
	}
	return "with UID " + c.conf.Pod.UID
}

// withClaimedNIC has host-device move the pod's claimed NIC in, then runs
// attach, the normal ADD, on host-device's result with the NIC pinned by
// its PCI address, as if the network's configuration named it. When
// attach fails, host-device takes the NIC back.
func (c *call) withClaimedNIC(attach func() error) error {
	if err := c.draConflict(); err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	dev, err := c.claimedNIC()
	if err != nil {
		return err
	}
	c.claimed = &dev
	hostName, host, err := c.readHostLink(dev)
	if err != nil {
		return err
	}
	ctx := context.Background()
	res, err := c.p.delegate().Add(ctx, hostDevice, c.delegateConf(dev.PCIAddress, ""))
	if err != nil {
		// host-device puts the NIC back on failure, but the move took
		// its addresses.
		if rerr := c.restoreHostLink(dev.PCIAddress, hostName, host); rerr != nil {
			c.log.Errorf("rollback: %v", rerr)
		}
		return fmt.Errorf("host-device could not move the pod's NIC %s into the pod as %s: %v", dev.PCIAddress, c.args.IfName, err)
	}
	c.log.Infof("host-device moved NIC %s into the pod as %s", dev.PCIAddress, c.args.IfName)
	c.hostLink = host
	if pl := podLinkOf(dev, host); pl != nil {
		if err = c.p.links().ApplyPod(c.args.Netns, c.args.IfName, *pl); err != nil {
			err = fmt.Errorf("setting up NIC %s as its claim says in the pod (%s): %v", dev.PCIAddress, c.args.IfName, err)
		}
	}
	if err == nil && host != nil {
		res, err = withHostAddrs(res, c.args.IfName, host.Addrs)
	}
	if err == nil {
		err = c.conf.SetPrevResult(res)
	}
	if err == nil {
		c.conf.PinDRA(dev.PCIAddress, fmt.Sprintf("the pod's claim (request %s)", dev.Request))
		err = attach()
	}
	if err == nil {
		return nil
	}
	if derr := c.p.delegate().Del(ctx, hostDevice, c.delegateConf("", c.args.IfName)); derr != nil {
		c.log.Errorf("rollback: host-device DEL: %v", derr)
		return fmt.Errorf("%v; host-device could not take NIC %s back out of the pod either: %v (the runtime's DEL retries)", err, dev.PCIAddress, derr)
	}
	c.log.Infof("rollback: host-device took NIC %s back", dev.PCIAddress)
	if rerr := c.restoreHostLink(dev.PCIAddress, hostName, host); rerr != nil {
		c.log.Errorf("rollback: %v", rerr)
		return fmt.Errorf("%v; %v", err, rerr)
	}
	return err
}

// delClaimedNIC has host-device take the NIC named CNI_IFNAME out of the
// pod, after the RDMA device went home: it needs no record. What is
// already done is no error: a netns that is gone gave the NIC back to the
// host (its addresses are then released by the IPAM plugin directly, as
// host-device would have), and a link no longer in the pod was taken out.
func (c *call) delClaimedNIC() error {
	if err := state.ValidatePlainIfName(c.args.IfName); err != nil {
		// ADD refuses this name before it calls host-device.
		return nil
	}
	ctx := context.Background()
	conf := c.delegateConf("", c.args.IfName)
	if netnsGone(c.args.Netns) {
		return c.releaseAddresses(ctx, conf)
	}
	err := c.p.delegate().Del(ctx, hostDevice, conf)
	switch {
	case err == nil:
		c.log.Infof("host-device took NIC %s out of the pod", c.args.IfName)
		return nil
	case linkGone(err, c.args.IfName):
		c.log.Infof("NIC %s is no longer in the pod; nothing for host-device to take out", c.args.IfName)
		return nil
	case netnsGone(c.args.Netns):
		return c.releaseAddresses(ctx, conf)
	}
	return fmt.Errorf("host-device could not take NIC %s out of the pod: %v; retry DEL", c.args.IfName, err)
}

// linkGone reports whether host-device's DEL failed because the pod has
// no link of that name: it looks the link up before anything else, after
// releasing the addresses, and says so in these words.
func linkGone(err error, ifName string) bool {
	return strings.Contains(err.Error(), fmt.Sprintf("failed to find %q in containerNS", ifName))
}

// releaseAddresses runs the IPAM plugin's DEL when the pod's netns is
// gone: host-device cannot open it and would fail before releasing them.
func (c *call) releaseAddresses(ctx context.Context, conf []byte) error {
	var ipam struct {
		Type string `json:"type"`
	}
	if len(c.conf.IPAM) == 0 || json.Unmarshal(c.conf.IPAM, &ipam) != nil || ipam.Type == "" {
		c.log.Debugf("pod netns gone: the kernel gave NIC %s back to the host; no IPAM to release", c.args.IfName)
		return nil
	}
	if err := c.p.delegate().Del(ctx, ipam.Type, conf); err != nil {
		return fmt.Errorf("pod netns gone; the IPAM plugin %s could not release the addresses of %s: %v; retry DEL", config.Quote(ipam.Type), c.args.IfName, err)
	}
	c.log.Infof("pod netns gone: the kernel gave NIC %s back to the host; IPAM %s released its addresses", c.args.IfName, config.Quote(ipam.Type))
	return nil
}

func (p *Plugin) delegate() Delegate {
	if p.Delegate != nil {
		return p.Delegate
	}
	return execDelegate{}
}
