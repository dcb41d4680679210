package cririg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodSpec is what kubelet puts in a RunPodSandbox request, reduced to what
// the tests vary.
type PodSpec struct {
	Name      string
	Namespace string // default "default"
	UID       string // default "uid-<namespace>-<name>"
	// Handler is the runtime handler (a RuntimeClass's handler): one of
	// Handlers(), or "" for the default runtime and network.
	Handler string
	// Annotations are the pod's, which kubelet passes on to the sandbox.
	Annotations map[string]string
	// MemLimit is the pod's memory limit in bytes, the sum of its
	// containers' that kubelet puts in the sandbox config; 0 for none.
	MemLimit int64
}

// Pod is a sandbox containerd created.
type Pod struct {
	ID     string
	Spec   PodSpec
	Config *runtimeapi.PodSandboxConfig
	// Netns is the path of the pod's network namespace
	// (/var/run/netns/cni-<uuid>), which containerd passed as CNI_NETNS.
	Netns string
}

// SandboxConfig is the PodSandboxConfig kubelet would send for spec.
func SandboxConfig(spec PodSpec) *runtimeapi.PodSandboxConfig {
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if spec.UID == "" {
		spec.UID = "uid-" + spec.Namespace + "-" + spec.Name
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name: spec.Name, Namespace: spec.Namespace, Uid: spec.UID,
		},
		Hostname:     spec.Name,
		LogDirectory: filepath.Join(Dir, "pods", spec.Namespace+"_"+spec.Name+"_"+spec.UID),
		Labels:       map[string]string{"app": spec.Name},
		Annotations:  spec.Annotations,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{Resources: podResources(spec.MemLimit)},
	}
}

func podResources(memLimit int64) *runtimeapi.LinuxContainerResources {
	if memLimit == 0 {
		return nil
	}
	return &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: memLimit}
}

// RunPod is RunPodSandbox: containerd creates the netns, runs the CNI ADDs
// of the handler's network and starts the pause container.
func (c *Containerd) RunPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	cfg := SandboxConfig(spec)
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		return nil, err
	}
	resp, err := c.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: spec.Handler})
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s/%s (handler %q): %v", cfg.Metadata.Namespace, spec.Name, spec.Handler, err)
	}
	p := &Pod{ID: resp.PodSandboxId, Spec: spec, Config: cfg}
	if p.Netns, err = c.PodNetns(ctx, p.ID); err != nil {
		return p, err
	}
	return p, nil
}

// PodNetns is the netns path containerd recorded for a sandbox, from the
// verbose PodSandboxStatus.
func (c *Containerd) PodNetns(ctx context.Context, id string) (string, error) {
	st, err := c.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return "", fmt.Errorf("PodSandboxStatus %s: %v", id, err)
	}
	// containerd's SandboxInfo; its metadata is versioned.
	var info struct {
		Metadata struct {
			Metadata struct {
				NetNSPath string
			}
		} `json:"sandboxMetadata"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		return "", fmt.Errorf("PodSandboxStatus %s: verbose info: %v", id, err)
	}
	if info.Metadata.Metadata.NetNSPath == "" {
		return "", fmt.Errorf("PodSandboxStatus %s: no netns path in the verbose info", id)
	}
	return info.Metadata.Metadata.NetNSPath, nil
}

// StopPod is StopPodSandbox: containers killed, CNI DEL with the netns.
func (c *Containerd) StopPod(ctx context.Context, id string) error {
	if _, err := c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %v", id, err)
	}
	return nil
}

// RemovePod is RemovePodSandbox (containerd sends a second DEL, without a
// netns).
func (c *Containerd) RemovePod(ctx context.Context, id string) error {
	if _, err := c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %v", id, err)
	}
	return nil
}

// Pods are the sandboxes containerd knows, in any state.
func (c *Containerd) Pods(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	resp, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %v", err)
	}
	return resp.Items, nil
}

// Cleanup stops and removes every sandbox containerd knows, as kubelet
// does with pods that should not exist; it returns every error it met.
func (c *Containerd) Cleanup(ctx context.Context) error {
	pods, err := c.Pods(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods {
		if err := c.StopPod(ctx, p.Id); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := c.RemovePod(ctx, p.Id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ContainerSpec is a container of a pod, reduced to what the tests vary.
type ContainerSpec struct {
	Name    string
	Image   string   // default ToolsImage
	Command []string // default: sleep until killed
	// Devices are host device nodes given to the container at the same
	// path, read-write (what an RDMA device plugin hands over today:
	// /dev/infiniband/uverbsN and /dev/infiniband/rdma_cm).
	Devices []string
	// AddCaps are capabilities added to the runtime's default set, such as
	// IPC_LOCK (verbs pins memory); DropCaps are taken from it ("ALL":
	// every one).
	AddCaps, DropCaps []string
	Env               map[string]string
	// RunAsUser is the uid the container runs as; nil: the image's.
	RunAsUser *int64
	// NoNewPrivs and ReadonlyRootfs are the security context's
	// allowPrivilegeEscalation: false and readOnlyRootFilesystem: true.
	NoNewPrivs, ReadonlyRootfs bool
}

// Container is a started container.
type Container struct {
	ID  string
	Pod *Pod
}

// RunContainer is CreateContainer then StartContainer.
func (c *Containerd) RunContainer(ctx context.Context, pod *Pod, spec ContainerSpec) (*Container, error) {
	if spec.Image == "" {
		spec.Image = ToolsImage
	}
	if spec.Command == nil {
		spec.Command = []string{"sleep", "86400"}
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: spec.Name},
		Image:    &runtimeapi.ImageSpec{Image: spec.Image},
		Command:  spec.Command,
		LogPath:  spec.Name + ".log",
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				Capabilities:   &runtimeapi.Capability{AddCapabilities: spec.AddCaps, DropCapabilities: spec.DropCaps},
				NoNewPrivs:     spec.NoNewPrivs,
				ReadonlyRootfs: spec.ReadonlyRootfs,
			},
		},
	}
	if spec.RunAsUser != nil {
		cfg.Linux.SecurityContext.RunAsUser = &runtimeapi.Int64Value{Value: *spec.RunAsUser}
	}
	for k, v := range spec.Env {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: k, Value: []byte(v)})
	}
	for _, d := range spec.Devices {
		cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: d, HostPath: d, Permissions: "rwm"})
	}
	created, err := c.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: pod.ID, Config: cfg, SandboxConfig: pod.Config,
	})
	if err != nil {
		return nil, fmt.Errorf("CreateContainer %s in pod %s: %v", spec.Name, pod.Spec.Name, err)
	}
	if _, err := c.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		return nil, fmt.Errorf("StartContainer %s in pod %s: %v", spec.Name, pod.Spec.Name, err)
	}
	return &Container{ID: created.ContainerId, Pod: pod}, nil
}

// ExecResult is what ExecSync returned.
type ExecResult struct {
	Stdout, Stderr string
	ExitCode       int32
}

// Exec is ExecSync: argv runs in the container and Exec waits up to
// timeout for it. A non-zero exit status is an error that carries the
// output.
func (c *Containerd) Exec(ctx context.Context, ctr *Container, timeout time.Duration, argv ...string) (ExecResult, error) {
	// The CRI deadline is in whole seconds; the gRPC one leaves it room.
	secs := int64((timeout + time.Second - 1) / time.Second)
	ctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	defer cancel()
	resp, err := c.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctr.ID, Cmd: argv, Timeout: secs})
	if err != nil {
		return ExecResult{}, fmt.Errorf("ExecSync %v in pod %s: %v", argv, ctr.Pod.Spec.Name, err)
	}
	r := ExecResult{Stdout: string(resp.Stdout), Stderr: string(resp.Stderr), ExitCode: resp.ExitCode}
	if r.ExitCode != 0 {
		return r, fmt.Errorf("%v in pod %s exited %d:\n%s%s", argv, ctr.Pod.Spec.Name, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r, nil
}

// Wait polls cond every 100ms until it is true, it fails, or timeout
// passes; what it returned last is in the timeout error.
func Wait(timeout time.Duration, what string, cond func() (bool, error)) error {
	var last error
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			break
		}
	}
	if last != nil {
		return fmt.Errorf("%s: not after %s: %v", what, timeout, last)
	}
	return fmt.Errorf("%s: not after %s", what, timeout)
}
