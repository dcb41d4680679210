// Package deviceplugin is a kubelet device plugin that hands out NICs by
// PCI address, as sriov-network-device-plugin does for VFs and PFs. It
// stands in for that plugin, which cannot be installed here: the e2e
// suite runs it on the node to give one pod several NICs of one resource,
// each behind a NetworkAttachmentDefinition with that resourceName, so
// Multus reads the allocation from kubelet's PodResources API and hands
// each attachment its NIC's address as deviceID and pciBusID.
//
// It speaks the device plugin API v1beta1 (k8s.io/kubelet): it registers
// with kubelet, lists its NICs healthy, and answers Allocate with the
// variable sriov-network-device-plugin sets (PCIDEVICE_<RESOURCE>), so the
// containers see which NICs they were given. It never changes a NIC: the
// CNI chain moves them.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin serves one resource made of NICs named by PCI address.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	pci      []string
	dir      string // kubelet's device plugin directory
	socket   string

	server  *grpc.Server
	stopped chan struct{}
	once    sync.Once

	mu        sync.Mutex
	allocated [][]string // every Allocate's device IDs, in call order
}

var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// New is a plugin for resource (domain/name, as a pod's resources name
// it) with the NICs at the given PCI addresses, registering through
// kubelet's socket in dir (pluginapi.DevicePluginPath on a node).
func New(resource string, pci []string, dir string) (*Plugin, error) {
	if !strings.Contains(resource, "/") {
		return nil, fmt.Errorf("device plugin resource %q: want domain/name, as kubelet requires", resource)
	}
	if len(pci) == 0 {
		return nil, fmt.Errorf("device plugin %s: no NICs to hand out", resource)
	}
	for _, a := range pci {
		if !pciAddress.MatchString(a) {
			return nil, fmt.Errorf("device plugin %s: %q is not a PCI address (0000:00:07.0)", resource, a)
		}
	}
	name := strings.NewReplacer("/", "_", ".", "_").Replace(resource)
	return &Plugin{resource: resource, pci: pci, dir: dir,
		socket: filepath.Join(dir, "rdma-netns-e2e-"+name+".sock"), stopped: make(chan struct{})}, nil
}

// Start serves the plugin's socket and registers it with kubelet. Kubelet
// then calls ListAndWatch and advertises the NICs as the node's capacity.
func (p *Plugin) Start(ctx context.Context) error {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("device plugin %s: remove the old socket: %w", p.resource, err)
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("device plugin %s: listen on %s: %w", p.resource, p.socket, err)
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go p.server.Serve(l)
	if err := p.register(ctx); err != nil {
		p.Stop()
		return err
	}
	return nil
}

func (p *Plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("device plugin %s: connect to kubelet: %w", p.resource, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("device plugin %s: register with kubelet: %w", p.resource, err)
	}
	return nil
}

// Stop ends ListAndWatch, which tells kubelet the resource is gone, and
// removes the socket.
func (p *Plugin) Stop() {
	p.once.Do(func() {
		close(p.stopped)
		if p.server != nil {
			p.server.Stop()
		}
		os.Remove(p.socket)
	})
}

// Allocated is the device IDs of every Allocate kubelet made, in order.
func (p *Plugin) Allocated() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]string(nil), p.allocated...)
}

func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the NICs once, all healthy, and holds the stream
// open until the plugin stops: a NIC of this plugin never fails.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	devs := make([]*pluginapi.Device, 0, len(p.pci))
	for _, a := range p.pci {
		devs = append(devs, &pluginapi.Device{ID: a, Health: pluginapi.Healthy})
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	select {
	case <-p.stopped:
	case <-stream.Context().Done():
	}
	return nil
}

// Allocate gives each container the addresses of its NICs in the
// variable sriov-network-device-plugin sets, PCIDEVICE_ and the resource
// name upper-cased with '.' and '/' as '_'.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	env := "PCIDEVICE_" + strings.ToUpper(strings.NewReplacer(".", "_", "/", "_", "-", "_").Replace(p.resource))
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		for _, id := range c.DevicesIds {
			if !p.has(id) {
				return nil, fmt.Errorf("device plugin %s: kubelet asked for %s, which this plugin does not hand out (%s)", p.resource, id, strings.Join(p.pci, ", "))
			}
		}
		p.mu.Lock()
		p.allocated = append(p.allocated, append([]string(nil), c.DevicesIds...))
		p.mu.Unlock()
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{env: strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *Plugin) has(id string) bool {
	for _, a := range p.pci {
		if a == id {
			return true
		}
	}
	return false
}
