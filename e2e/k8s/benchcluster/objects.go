package benchcluster

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/publish"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/slices"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/gpudriver"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// The stand-in GPU driver and the class conf's pairs template names, as
// the suite's TestDRAPairs has them (e2e/k8s/pairs_test.go).
const (
	GPUDriver = "gpu.e2e.rdma-netns.io"
	GPUClass  = "gpu.nvidia.com"
)

// NodeName is simulated node i's name (1 for the first).
func NodeName(i int) string { return fmt.Sprintf("bench-node-%04d", i) }

// NodeObject is a kubelet-less node as Kubernetes' scheduler_perf makes them:
// Ready, room for more pods than any template puts on it.
func NodeObject(name string) *corev1.Node {
	rl := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("128"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{
			Capacity: rl, Allocatable: rl, Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
}

// NICResources is what rdma-netns-dra publishes for node on the sysfs at
// root: its own scan, merge and slice code (package slices), records in
// recordDir (none: no NIC held), the netns mode read as the driver reads
// it (package publish).
func NICResources(node, root, recordDir string) (resourceslice.DriverResources, error) {
	inv, skipped, err := slices.Refresh(nics.Scanner{Root: root}, drarecord.Dir(recordDir))
	if err != nil {
		return resourceslice.DriverResources{}, err
	}
	if len(skipped) > 0 {
		return resourceslice.DriverResources{}, fmt.Errorf("the driver skipped NICs of %s: %+v", root, skipped)
	}
	shared, why := publish.SharedMode(root)
	if shared {
		return resourceslice.DriverResources{}, fmt.Errorf("sysfs %s: %s", root, why)
	}
	return slices.Resources(node, inv, false), nil
}

// GPUDevices are the stand-in GPU driver's devices for the sysfs at root.
func GPUDevices(n *Server) ([]resourceapi.Device, error) {
	d, err := gpudriver.New(GPUDriver, n.GPUAddresses(), n.Root)
	if err != nil {
		return nil, err
	}
	return d.Devices(), nil
}

// Slice is the ResourceSlice the DRA library's slice controller writes
// for a node-local pool of one slice: named from the node and driver,
// generation 1.
func Slice(driver, node string, devs []resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-" + driver + "-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
			Devices:  devs,
		},
	}
}

// Template is a claim template the bench schedules pods with, and how
// many of its pods a node holds.
type Template struct {
	Name    string
	File    string // conf/<File>, "" for the bench's own GPU-only control
	PerNode int
	Control bool
}

// Templates are conf's templates as shipped and the GPU-only control,
// the control first. Per node: the pairs template takes 4 of the 8 GPUs,
// the rails one the 4 NICs it names, the any-N one 2 NICs of 8.
var Templates = []Template{
	{Name: "gpu-only-4", PerNode: GPUsPerNode / 4, Control: true},
	{Name: "gpu-nic-pairs-4", File: "dra-claimtemplate-pairs.yaml", PerNode: GPUsPerNode / 4},
	{Name: "rdma-rails-4", File: "dra-claimtemplate-rails.yaml", PerNode: 1},
	{Name: "rdma-nics-2", File: "dra-claimtemplate.yaml", PerNode: NICsPerNode / 2},
}

// ControlTemplate is the GPU-only control: the pairs template's four GPU
// requests, without the NICs and their constraints.
func ControlTemplate(name string) *resourceapi.ResourceClaimTemplate {
	var reqs []resourceapi.DeviceRequest
	for i := 0; i < 4; i++ {
		reqs = append(reqs, resourceapi.DeviceRequest{Name: fmt.Sprintf("gpu%d", i),
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: GPUClass}})
	}
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}},
	}
}

// Load reads t's claim template from confDir as shipped.
func (t Template) Load(confDir string) (*resourceapi.ResourceClaimTemplate, error) {
	if t.File == "" {
		return ControlTemplate(t.Name), nil
	}
	var tmpl resourceapi.ResourceClaimTemplate
	if err := readYAML(filepath.Join(confDir, t.File), &tmpl); err != nil {
		return nil, err
	}
	if tmpl.Name != t.Name {
		return nil, fmt.Errorf("%s: template %q, want %q (the bench's table names conf's templates)", t.File, tmpl.Name, t.Name)
	}
	return &tmpl, nil
}

// NICClass is conf/dra-deviceclass.yaml as shipped.
func NICClass(confDir string) (*resourceapi.DeviceClass, error) {
	var c resourceapi.DeviceClass
	return &c, readYAML(filepath.Join(confDir, "dra-deviceclass.yaml"), &c)
}

func readYAML(path string, into any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Pod is a pod of a job on template: one container, never run (no
// kubelet), holding a claim made from the template.
func Pod(name, template string) *corev1.Pod {
	p := PlainPod(name)
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devs", ResourceClaimTemplateName: ptr.To(template)}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "devs"}}
	return p
}

// PlainPod is a pod without claims.
func PlainPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}
