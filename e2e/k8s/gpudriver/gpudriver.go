// Package gpudriver is a DRA driver for stand-in GPUs, as a GPU vendor's
// driver publishes real ones. It stands in for such a driver, which
// cannot run here (the test VM has no GPU): the e2e suite runs it on the
// node to offer PCI functions as GPUs, so that one ResourceClaim can ask
// for a GPU and a NIC of rdma-netns-dra under the same PCIe root
// (matchAttribute resource.kubernetes.io/pcieRoot), each GPU with its own
// NIC.
//
// Each GPU carries the standard attributes a GPU driver publishes for
// that (pcieRoot, pciBusID, numaNode) and its index. Prepare only
// remembers which devices each claim got, for the test to read: a
// stand-in gives the container nothing (no CDI device) and never touches
// the PCI function.
package gpudriver

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// AttrIndex is a GPU's position in the list given to New, as a GPU
// driver numbers its GPUs.
const AttrIndex resourceapi.QualifiedName = "gpu.e2e.rdma-netns.io/index"

// kubelet's directories on the node, as rdma-netns-dra uses them.
const (
	registrarDir  = "/var/lib/kubelet/plugins_registry"
	pluginDirBase = "/var/lib/kubelet/plugins/"
)

// Driver implements kubeletplugin.DRAPlugin for its stand-in GPUs.
type Driver struct {
	// Log takes what the kubelet plugin helper could not do in the
	// background (publishing the slice, mostly); stderr by default.
	Log *log.Logger

	name    string
	devices []resourceapi.Device
	// kubelet's directories; tests put them in a temporary directory.
	registrarDir, pluginDir string
	known                   map[string]bool // device names, to refuse a result naming another

	// helperMu is apart from mu: Stop waits for the helper's gRPC
	// server, whose calls in flight wait for mu.
	helperMu sync.Mutex
	helper   *kubeletplugin.Helper

	mu       sync.Mutex
	prepared map[types.UID][]string
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New is a driver named driverName (a DNS subdomain, the drivers of a
// DeviceClass's selector) offering one GPU per PCI function, found in the
// sysfs mounted at sysfsRoot ("/sys" on a node; tests give a fake tree).
func New(driverName string, pciAddresses []string, sysfsRoot string) (*Driver, error) {
	if driverName == "" {
		return nil, errors.New("GPU stand-in driver: empty driver name")
	}
	if len(pciAddresses) == 0 {
		return nil, fmt.Errorf("GPU stand-in driver %s: no PCI functions to offer as GPUs", driverName)
	}
	d := &Driver{Log: log.New(os.Stderr, "gpudriver "+driverName+": ", log.LstdFlags),
		name: driverName, known: map[string]bool{}, prepared: map[types.UID][]string{},
		registrarDir: registrarDir, pluginDir: pluginDirBase + driverName}
	for i, addr := range pciAddresses {
		dev, err := device(addr, int64(i), sysfsRoot)
		if err != nil {
			return nil, fmt.Errorf("GPU stand-in driver %s: %w", driverName, err)
		}
		if d.known[dev.Name] {
			return nil, fmt.Errorf("GPU stand-in driver %s: PCI function %s listed twice; each is one GPU", driverName, addr)
		}
		d.known[dev.Name] = true
		d.devices = append(d.devices, dev)
	}
	return d, nil
}

// DeviceName is the slice's name for the GPU at a PCI address:
// 0000:00:07.0 is gpu-0000-00-07-0 (a DNS label, as the API wants).
func DeviceName(pciAddress string) string {
	return "gpu-" + strings.NewReplacer(":", "-", ".", "-").Replace(pciAddress)
}

// device describes the GPU at addr. pcieRoot is required, not left out
// as rdma-netns-dra leaves it out of a NIC's: a GPU without it could not
// be aligned with a NIC, and the test relying on it would pass for the
// wrong reason or fail far from here.
func device(addr string, index int64, sysfsRoot string) (resourceapi.Device, error) {
	if !rdmadev.IsPCIAddress(addr) {
		return resourceapi.Device{}, fmt.Errorf("%q is not a PCI address (want domain:bus:device.function in lower case, 0000:00:07.0)", addr)
	}
	if _, err := (rdmadev.Sysfs{Root: sysfsRoot}).BusDevicePath("pci", addr); err != nil {
		return resourceapi.Device{}, fmt.Errorf("PCI function %s: %w", addr, err)
	}
	fsys := deviceattribute.WithFSFromRoot(sysfsRoot)
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrIndex: {IntValue: ptr.To(index)},
	}
	busID, err := deviceattribute.GetPCIBusIDAttribute(addr)
	if err != nil {
		return resourceapi.Device{}, fmt.Errorf("PCI function %s: %w", addr, err)
	}
	attrs[busID.Name] = busID.Value
	root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(addr, fsys)
	if err != nil {
		return resourceapi.Device{}, fmt.Errorf("PCI function %s: finding its PCIe root in %s: %w", addr, sysfsRoot, err)
	}
	attrs[root.Name] = root.Value
	// An error is the kernel's numa_node -1 (or no such file): the
	// attribute is then left out, as the standard asks and as
	// rdma-netns-dra does for its NICs.
	if numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(addr, deviceattribute.ScalarAttribute, fsys); err == nil {
		attrs[numa.Name] = numa.Value
	}
	return resourceapi.Device{Name: DeviceName(addr), Attributes: attrs}, nil
}

// Devices is what the driver publishes, in the order New was given.
func (d *Driver) Devices() []resourceapi.Device {
	out := make([]resourceapi.Device, len(d.devices))
	for i, dev := range d.devices {
		out[i] = *dev.DeepCopy()
	}
	return out
}

// Start registers the driver with the node's kubelet, in this process,
// and publishes its GPUs as the node's pool (named for the node). The
// registrar directory is kubelet's and the plugin directory is made under
// kubelet's, so the caller runs on the node as root.
func (d *Driver) Start(ctx context.Context, kube kubernetes.Interface, nodeName string) error {
	if nodeName == "" {
		return fmt.Errorf("GPU stand-in driver %s: no node name to publish the pool for", d.name)
	}
	d.helperMu.Lock()
	defer d.helperMu.Unlock()
	if d.helper != nil {
		return fmt.Errorf("GPU stand-in driver %s: already started", d.name)
	}
	// rdma-netns-dra's DaemonSet mounts its directory; nothing makes
	// this driver's, and the helper does not either.
	if err := os.MkdirAll(d.pluginDir, 0o750); err != nil {
		return fmt.Errorf("GPU stand-in driver %s: creating the plugin directory: %w", d.name, err)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(d.name),
		kubeletplugin.KubeClient(kube),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.RegistrarDirectoryPath(d.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(d.pluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("GPU stand-in driver %s: starting the kubelet plugin (registrar %s, plugin dir %s): %w", d.name, d.registrarDir, d.pluginDir, err)
	}
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: d.Devices()}}},
	}}
	if err := helper.PublishResources(ctx, res); err != nil {
		helper.Stop()
		return fmt.Errorf("GPU stand-in driver %s: publishing pool %s: %w", d.name, nodeName, err)
	}
	d.helper = helper
	return nil
}

// Stop unregisters from kubelet and stops publishing. kubelet removes the
// driver's ResourceSlice a while after it sees the driver gone, unless
// the driver registers again first.
func (d *Driver) Stop() {
	d.helperMu.Lock()
	defer d.helperMu.Unlock()
	if d.helper != nil {
		d.helper.Stop()
		d.helper = nil
	}
}

// Prepared is each prepared claim's devices of this driver, by claim UID.
func (d *Driver) Prepared() map[types.UID][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID][]string, len(d.prepared))
	for uid, devs := range d.prepared {
		out[uid] = append([]string(nil), devs...)
	}
	return out
}

// PrepareResourceClaims answers each claim with its devices of this
// driver (a claim may hold a NIC of rdma-netns-dra too) and remembers
// them. A device the driver does not publish fails that claim: the
// scheduler allocated from a slice this driver did not write.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devs, names, err := d.prepare(c)
		if err != nil {
			out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("GPU stand-in driver %s: claim %s/%s: %w", d.name, c.Namespace, c.Name, err)}
			continue
		}
		d.prepared[c.UID] = names
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (d *Driver) prepare(c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, []string, error) {
	if c.Status.Allocation == nil {
		return nil, nil, errors.New("not allocated")
	}
	var devs []kubeletplugin.Device
	var names []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		if !d.known[r.Device] {
			return nil, nil, fmt.Errorf("device %s (request %q) is not one this driver publishes", r.Device, r.Request)
		}
		devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
		names = append(names, r.Device)
	}
	return devs, names, nil
}

// UnprepareResourceClaims forgets the claims; a claim never prepared is
// already forgotten.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		delete(d.prepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError logs what the helper could not do in the background; it
// retries the recoverable errors itself.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.Log.Printf("%s: %v (retried)", msg, err)
		return
	}
	d.Log.Printf("%s: %v", msg, err)
}

// WatchHealthStatus: a stand-in GPU has no health to report (Start turns
// the health service off; this answers if it is ever asked).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// DeviceClass selects every GPU of the driver, for a claim to name.
func DeviceClass(name, driverName string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driverName)},
		}}},
	}
}
