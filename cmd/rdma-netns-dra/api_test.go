package main

import (
	"context"
	"io"
	"log"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/driver"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/internal/fakesys"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/publish"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// apiCalls are the API requests the driver makes, as "verb
// resource.group": exactly what the chart's ClusterRole grants
// (conf/helm/rdma-netns/templates/dra.yaml; conf's TestChartRBACExact
// holds the role to the same list). A call missing from the role fails
// on a real node with 403; a grant the driver never uses is a right a
// stolen token has for nothing.
var apiCalls = []string{
	"create resourceslices.resource.k8s.io",
	"delete resourceslices.resource.k8s.io",
	"get nodes",
	"get resourceclaims.resource.k8s.io",
	"list resourceslices.resource.k8s.io",
	"update resourceslices.resource.k8s.io",
	"watch resourceslices.resource.k8s.io",
}

// The driver, wired as main wires it to the kubelet plugin library, makes
// exactly apiCalls over a lifetime: publishing the node's NICs (the slice
// controller lists and watches the node's slices, gets the Node for their
// owner, creates the slice), publishing again when a NIC left the host
// (update), preparing a claim the kubelet names over gRPC (the library
// gets the claim), and withdrawing the pool (delete). No pod, no event,
// no patch.
func TestAPICalls(t *testing.T) {
	const node = "node1"
	sys := fakesys.New(t)
	netnsMode(t, sys.Root, "N")
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-nics-x7k2p", UID: "claim-1"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Driver: drarecord.DriverName, Request: "nic", Pool: node, Device: fakesys.VirtioDevice},
			}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod", UID: "pod-1"}},
		},
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid-1"}}, claim)
	// The API server names a slice from its generateName; the fake does
	// not, and the controller would take an unnamed slice for a stranger
	// (delete and create, where the API server's naming gets an update).
	cs.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if s := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice); s.Name == "" {
			s.Name = s.GenerateName + "x7k2p"
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	records := drarecord.Dir(t.TempDir())
	scanner := nics.Scanner{Root: sys.Root}
	pluginDir, regDir := t.TempDir(), t.TempDir()
	helper, err := kubeletplugin.Start(ctx, &driver.Driver{Records: records, Scanner: scanner, Log: log.New(io.Discard, "", 0)},
		kubeletplugin.DriverName(drarecord.DriverName),
		kubeletplugin.KubeClient(cs),
		kubeletplugin.NodeName(node),
		kubeletplugin.RegistrarDirectoryPath(regDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	// The sockets the driver's watch looks for are the ones kubeletplugin
	// made.
	if gone := missingSocket(kubeletSockets(regDir, pluginDir)); gone != "" {
		t.Fatalf("kubeletplugin made no %s", gone)
	}
	p := &publish.Publisher{Node: node, Records: records, Scanner: scanner, Sysfs: sys.Root, Log: log.New(io.Discard, "", 0), Publish: helper.PublishResources}

	p.Once(ctx)
	waitSlice(t, cs, "the slice published", func(s []resourceapi.ResourceSlice) bool { return len(s) == 1 && len(s[0].Spec.Devices) == 2 })
	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA)
	p.Once(ctx)
	waitSlice(t, cs, "the slice updated", func(s []resourceapi.ResourceSlice) bool { return len(s) == 1 && len(s[0].Spec.Devices) == 1 })

	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Claims[string(claim.UID)]; r == nil || r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("NodePrepareResources: %+v, want the claim's one device", r)
	}

	if err := helper.PublishResources(ctx, resourceslice.DriverResources{}); err != nil {
		t.Fatal(err)
	}
	waitSlice(t, cs, "the slice deleted", func(s []resourceapi.ResourceSlice) bool { return len(s) == 0 })

	var got []string
	for _, a := range cs.Actions() {
		r := a.GetResource()
		s := a.GetVerb() + " " + r.Resource
		if r.Group != "" {
			s += "." + r.Group
		}
		if sub := a.GetSubresource(); sub != "" {
			s += "/" + sub
		}
		got = append(got, s)
	}
	slices.Sort(got)
	if got = slices.Compact(got); !slices.Equal(got, apiCalls) {
		t.Errorf("API calls %q,\nwant %q", got, apiCalls)
	}
}

// waitSlice waits for the fake API server's ResourceSlices to satisfy ok,
// reading its store directly (not a request of the driver's).
func waitSlice(t *testing.T, cs *fake.Clientset, what string, ok func([]resourceapi.ResourceSlice) bool) {
	t.Helper()
	gvr := resourceapi.SchemeGroupVersion.WithResource("resourceslices")
	gvk := resourceapi.SchemeGroupVersion.WithKind("ResourceSlice")
	var last []resourceapi.ResourceSlice
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		obj, err := cs.Tracker().List(gvr, gvk, "")
		if err != nil {
			t.Fatal(err)
		}
		last = obj.(*resourceapi.ResourceSliceList).Items
		if ok(last) {
			return
		}
	}
	t.Fatalf("%s: not within 30s; slices %+v", what, last)
}
