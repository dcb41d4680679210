package deviceplugin

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is kubelet's registration service on dir/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{got: make(chan *pluginapi.RegisterRequest, 1)}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, k)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return k
}

func dial(t *testing.T, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// The plugin registers its resource and socket with kubelet, lists its
// NICs healthy, gives a container its NICs' addresses as
// sriov-network-device-plugin does, remembers what it allocated, and
// refuses a NIC it does not hand out.
func TestPluginAsKubeletSeesIt(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	nics := []string{"0000:00:0a.0", "0000:00:09.0"}
	p, err := New("rdma-netns.io/e2e_nic", nics, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()

	reg := <-k.got
	if reg.Version != pluginapi.Version || reg.ResourceName != "rdma-netns.io/e2e_nic" || filepath.Dir(filepath.Join(dir, reg.Endpoint)) != dir {
		t.Fatalf("registered %+v, want version %s, resource rdma-netns.io/e2e_nic, an endpoint in %s", reg, pluginapi.Version, dir)
	}
	c := dial(t, filepath.Join(dir, reg.Endpoint))

	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s is %s, want %s", d.ID, d.Health, pluginapi.Healthy)
		}
		ids = append(ids, d.ID)
	}
	if strings.Join(ids, " ") != strings.Join(nics, " ") {
		t.Errorf("ListAndWatch lists %v, want %v", ids, nics)
	}

	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{nics[1], nics[0]}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["PCIDEVICE_RDMA_NETNS_IO_E2E_NIC"]; got != nics[1]+","+nics[0] {
		t.Errorf("PCIDEVICE_RDMA_NETNS_IO_E2E_NIC=%q, want the allocated NICs in kubelet's order", got)
	}
	if got := p.Allocated(); len(got) != 1 || strings.Join(got[0], " ") != nics[1]+" "+nics[0] {
		t.Errorf("Allocated() = %v", got)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:00:0b.0"}}}}); err == nil || !strings.Contains(err.Error(), "0000:00:0b.0") {
		t.Errorf("Allocate of a NIC the plugin does not have: %v, want an error naming it", err)
	}

	// Stopping ends the stream: kubelet then marks the resource gone.
	p.Stop()
	if _, err := stream.Recv(); err == nil {
		t.Error("ListAndWatch still open after Stop")
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		resource string
		pci      []string
	}{
		{"e2e_nic", []string{"0000:00:07.0"}},
		{"rdma-netns.io/e2e_nic", nil},
		{"rdma-netns.io/e2e_nic", []string{"eth4"}},
	} {
		if _, err := New(c.resource, c.pci, t.TempDir()); err == nil {
			t.Errorf("New(%q, %q) accepted", c.resource, c.pci)
		}
	}
}
