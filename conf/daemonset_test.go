package conf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/rdma-netns/rdma-netns/pkg/install"
	"github.com/rdma-netns/rdma-netns/pkg/nriplugin"
)

// imageBinaries are the files make image puts in the image, at /NAME: the
// NAME of every NAME=PACKAGE in the Makefile's IMAGE_BINS.
func imageBinaries() ([]string, error) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`(?m)^IMAGE_BINS\s*:?=(.*)$`).FindSubmatch(mk)
	if m == nil {
		return nil, errors.New("no IMAGE_BINS in ../Makefile: which binaries does the image hold?")
	}
	var names []string
	for _, f := range strings.Fields(string(m[1])) {
		name, _, _ := strings.Cut(f, "=")
		names = append(names, name)
	}
	return names, nil
}

// checkInstaller checks the DaemonSet against the image make image builds
// and the flags `rdma-netns install` has: every container runs a binary
// of the image (scratch: there is no shell), an init container installs
// into a writable hostPath mount, and the pod keeps a container running.
func checkInstaller(spec corev1.PodSpec, bins []string) error {
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	var image string
	installs := 0
	check := func(c corev1.Container, init bool) error {
		if image == "" {
			image = c.Image
		}
		if c.Image != image {
			return fmt.Errorf("image %s differs from %s: the installer needs one image", c.Image, image)
		}
		if len(c.Command) == 0 || !slices.Contains(bins, strings.TrimPrefix(c.Command[0], "/")) || !strings.HasPrefix(c.Command[0], "/") {
			return fmt.Errorf("command %q does not start with one of the image's binaries /%s (the image has no shell)", c.Command, strings.Join(bins, ", /"))
		}
		if c.Command[0] != "/rdma-netns" || len(c.Command) < 2 || c.Command[1] != "install" {
			return nil // the exporter, for one
		}
		o, err := installOptions(c.Command[2:])
		if err != nil {
			return err
		}
		if init && o.ThenWait {
			return errors.New("init container runs install --then-wait: it never exits and the pod never starts")
		}
		if !init && !o.ThenWait {
			return errors.New("container runs install without --then-wait: it exits and the kubelet restarts it forever")
		}
		if init {
			installs++
		}
		if err := checkDest(c, o.Dest, volumes); err != nil {
			return err
		}
		if o.NRI.Src != "" {
			if err := checkInstallNRI(c, o.NRI, bins, volumes); err != nil {
				return err
			}
		}
		return checkRootNoCaps(c.SecurityContext)
	}
	for _, c := range spec.InitContainers {
		if err := check(c, true); err != nil {
			return fmt.Errorf("init container %s: %w", c.Name, err)
		}
	}
	for _, c := range spec.Containers {
		if err := check(c, false); err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
	}
	if installs == 0 {
		return errors.New("no init container runs /rdma-netns install")
	}
	if len(spec.Containers) == 0 {
		return errors.New("no container keeps the pod running (the exporter, or /rdma-netns install --then-wait)")
	}
	return nil
}

// installOptions parses the arguments after `install` with the command's
// own flag set, as the binary will.
func installOptions(args []string) (install.Options, error) {
	var o install.Options
	fl := install.FlagSet(&o)
	fl.SetOutput(io.Discard)
	if err := fl.Parse(args); err != nil {
		return o, fmt.Errorf("rdma-netns install %q: %w", args, err)
	}
	o.NRI.Flags = fl.Args()
	if fl.NArg() > 0 && o.NRI.Src == "" {
		return o, fmt.Errorf("rdma-netns install takes no argument %q without --nri", fl.Arg(0))
	}
	return o, nil
}

// checkInstallNRI: --nri is the image's plugin, its directories are
// writable hostPath mounts, and its flags are the plugin's own (the
// copy the runtime launches must behave as the container nri does).
func checkInstallNRI(c corev1.Container, n install.NRI, bins []string, volumes map[string]corev1.Volume) error {
	if !slices.Contains(bins, strings.TrimPrefix(n.Src, "/")) {
		return fmt.Errorf("--nri %s is not one of the image's binaries /%s", n.Src, strings.Join(bins, ", /"))
	}
	for _, dir := range []string{n.PluginDir, n.ConfDir} {
		if err := checkHostDir(c, dir, volumes); err != nil {
			return err
		}
	}
	var o nriplugin.Options
	fl := nriplugin.FlagSet(&o)
	fl.SetOutput(io.Discard)
	if err := fl.Parse(n.Flags); err != nil || fl.NArg() > 0 {
		return fmt.Errorf("the NRI plugin's flags %q: %v (args %q)", n.Flags, err, fl.Args())
	}
	if _, err := o.Policy(); err != nil {
		return fmt.Errorf("the NRI plugin's flags %q: %w", n.Flags, err)
	}
	return nil
}

// checkHostDir: dir is a writable hostPath mount of the container.
func checkHostDir(c corev1.Container, dir string, volumes map[string]corev1.Volume) error {
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		if v := volumes[m.Name]; v.HostPath == nil {
			return fmt.Errorf("%s is volume %q, want a hostPath (the runtime reads the host's)", dir, m.Name)
		}
		if m.ReadOnly {
			return fmt.Errorf("%s is mounted readOnly", dir)
		}
		return nil
	}
	return fmt.Errorf("%s is not a volumeMount of the container: it would install into the container's own file system", dir)
}

// nriFlags are the NRI plugin's flags in the init container's install
// command, nil without --nri.
func nriFlags(spec corev1.PodSpec) []string {
	for _, c := range spec.InitContainers {
		if len(c.Command) > 1 && c.Command[0] == "/rdma-netns" && c.Command[1] == "install" {
			if o, err := installOptions(c.Command[2:]); err == nil && o.NRI.Src != "" {
				return o.NRI.Flags
			}
		}
	}
	return nil
}

// checkDest: --dest must be where the host's directory is mounted, writable.
func checkDest(c corev1.Container, dest string, volumes map[string]corev1.Volume) error {
	for _, m := range c.VolumeMounts {
		if m.MountPath != dest {
			continue
		}
		v := volumes[m.Name]
		if v.HostPath == nil || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory {
			return fmt.Errorf("--dest %s is volume %q, want a hostPath of type Directory (the node's CNI bin dir, never created by mistake)", dest, m.Name)
		}
		if m.ReadOnly {
			return fmt.Errorf("--dest %s is mounted readOnly", dest)
		}
		return nil
	}
	return fmt.Errorf("--dest %s is not a volumeMount of the container: it would install into the container's own file system", dest)
}

// checkRootNoCaps: root owns /opt/cni/bin, so the installer runs as uid 0,
// but with nothing else.
func checkRootNoCaps(sc *corev1.SecurityContext) error {
	switch {
	case sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0:
		return errors.New("must run as uid 0, the owner of /opt/cni/bin")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		return errors.New("needs readOnlyRootFilesystem: it writes only to --dest")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return errors.New("needs allowPrivilegeEscalation: false")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		return errors.New(`must drop ALL capabilities and add none: uid 0 owning the directory is enough`)
	}
	return nil
}

func loadDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	data, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests("daemonset.yaml", data)
	if err != nil {
		t.Fatalf("daemonset.yaml: %v", err)
	}
	var ds []*appsv1.DaemonSet
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.DaemonSet); ok {
			ds = append(ds, d)
		}
	}
	if len(ds) != 1 {
		t.Fatalf("daemonset.yaml: %d DaemonSets, want 1", len(ds))
	}
	return ds[0]
}

// Every way the installer could be misconfigured against the binary's
// flags, the image or the mount is caught; each case edits the real file.
func TestInstallerRejects(t *testing.T) {
	bins, err := imageBinaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*corev1.PodSpec)
		want string
	}{
		{"valid baseline", func(*corev1.PodSpec) {}, ""},
		{"unknown install flag", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/rdma-netns", "install", "--destination", "/host/opt/cni/bin"}
		}, "flag provided but not defined: -destination"},
		{"stray argument", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/rdma-netns", "install", "--dest", "/host/opt/cni/bin", "/opt/cni/bin"}
		}, "no argument"},
		{"shell", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/bin/sh", "-c", "cp /rdma-netns /host/opt/cni/bin/"}
		}, "no shell"},
		{"dest not mounted", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/rdma-netns", "install", "--dest", "/opt/cni/bin"}
		}, "not a volumeMount"},
		{"dest read-only", func(s *corev1.PodSpec) { s.InitContainers[0].VolumeMounts[0].ReadOnly = true }, "readOnly"},
		{"dest an emptyDir", func(s *corev1.PodSpec) {
			s.Volumes[0].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
		}, "hostPath of type Directory"},
		{"init container waits", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = slices.Insert(s.InitContainers[0].Command, 2, "--then-wait")
		}, "never starts"},
		{"main container exits", func(s *corev1.PodSpec) {
			s.Containers[0].Command = []string{"/rdma-netns", "install", "--dest", "/host/opt/cni/bin"}
		}, "restarts it forever"},
		{"nothing keeps running", func(s *corev1.PodSpec) { s.Containers = nil }, "keeps the pod running"},
		{"second image", func(s *corev1.PodSpec) { s.Containers[0].Image = "registry.k8s.io/pause:3.10" }, "one image"},
		{"not root", func(s *corev1.PodSpec) { uid := int64(1000); s.InitContainers[0].SecurityContext.RunAsUser = &uid }, "uid 0"},
		{"a capability", func(s *corev1.PodSpec) {
			s.InitContainers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"DAC_OVERRIDE"}
		}, "drop ALL"},
		{"no installer", func(s *corev1.PodSpec) { s.InitContainers = nil }, "no init container"},
		{"NRI flags without --nri", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/rdma-netns", "install", "--dest", "/host/opt/cni/bin", "--", "--shm-size", "1Gi"}
		}, "without --nri"},
		{"NRI plugin not in the image", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/rdma-netns", "install", "--dest", "/host/opt/cni/bin", "--nri", "/nri-plugin"}
		}, "not one of the image's binaries"},
		{"NRI plugin dir not mounted", func(s *corev1.PodSpec) {
			s.InitContainers[0].Command = []string{"/rdma-netns", "install", "--dest", "/host/opt/cni/bin", "--nri", "/rdma-netns-nri"}
		}, "/opt/nri/plugins is not a volumeMount"},
		{"NRI conf dir read-only", func(s *corev1.PodSpec) { s.InitContainers[0].VolumeMounts[2].ReadOnly = true }, "/host/etc/nri/conf.d is mounted readOnly"},
		{"bad NRI flag", func(s *corev1.PodSpec) {
			c := &s.InitContainers[0]
			c.Command = append(c.Command, "--shm", "1Gi")
		}, "flag provided but not defined: -shm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := loadDaemonSet(t).Spec.Template.Spec
			tc.edit(&spec)
			err := checkInstaller(spec, bins)
			wantRejection(t, "daemonset.yaml", err, tc.want)
		})
	}
}

// checkNRI checks the NRI plugin's container against the plugin's own flags
// and what it needs: the NRI socket's directory, the pod network
// namespaces read-only and the sandboxes' /dev/shm mounts, both with
// HostToContainer propagation (pods start after it), SYS_ADMIN and
// nothing else.
func checkNRI(spec corev1.PodSpec) error {
	var c *corev1.Container
	for i := range spec.Containers {
		if len(spec.Containers[i].Command) > 0 && spec.Containers[i].Command[0] == "/rdma-netns-nri" {
			c = &spec.Containers[i]
		}
	}
	if c == nil {
		return errors.New("no container runs /rdma-netns-nri")
	}
	var o nriplugin.Options
	fl := nriplugin.FlagSet(&o)
	fl.SetOutput(io.Discard)
	if err := fl.Parse(c.Command[1:]); err != nil {
		return fmt.Errorf("rdma-netns-nri %q: %w", c.Command[1:], err)
	}
	if fl.NArg() > 0 {
		return fmt.Errorf("rdma-netns-nri takes no argument %q", fl.Arg(0))
	}
	if _, err := o.Policy(); err != nil {
		return err
	}
	if flags := nriFlags(spec); flags != nil {
		var pre nriplugin.Options
		pfl := nriplugin.FlagSet(&pre)
		pfl.SetOutput(io.Discard)
		if err := pfl.Parse(flags); err != nil {
			return fmt.Errorf("the init container's NRI flags %q: %w", flags, err)
		}
		if pre.Memlock != o.Memlock || pre.ShmSize != o.ShmSize || pre.MaxShmSize != o.MaxShmSize || pre.LogLevel != o.LogLevel || pre.SandboxRoots != o.SandboxRoots {
			return fmt.Errorf("the pre-installed plugin's flags %q differ from the container's %q: pods would get other limits after a runtime restart", flags, c.Command[1:])
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if v := volumes[m.Name]; v.HostPath == nil {
			return fmt.Errorf("mount %s is not a hostPath: the plugin only needs the host's", m.MountPath)
		}
		mounts[m.MountPath] = m
	}
	need := func(path, why string, readOnly, propagate bool) error {
		m, ok := mounts[path]
		switch {
		case !ok:
			return fmt.Errorf("%s is not mounted: %s", path, why)
		case m.ReadOnly != readOnly:
			return fmt.Errorf("%s: readOnly %v, want %v (%s)", path, m.ReadOnly, readOnly, why)
		case propagate && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer):
			return fmt.Errorf("%s needs mountPropagation HostToContainer: %s, also for pods created after the plugin started", path, why)
		}
		delete(mounts, path)
		return nil
	}
	if err := need(filepath.Dir(o.Socket), "the plugin connects to the runtime's NRI socket "+o.Socket, false, false); err != nil {
		return err
	}
	if err := need("/var/run/netns", "the runtime names pod network namespaces there", true, true); err != nil {
		return err
	}
	for _, root := range strings.Split(o.SandboxRoots, ",") {
		if err := need(root, "a --sandbox-root: the runtime keeps each pod's /dev/shm tmpfs there and the plugin remounts it", false, true); err != nil {
			return err
		}
	}
	for p := range mounts {
		return fmt.Errorf("mount %s: the plugin does not need it", p)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil || sc.Privileged != nil && *sc.Privileged:
		return errors.New("must not be privileged")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYS_ADMIN"}):
		return errors.New("must drop ALL capabilities and add only SYS_ADMIN (setns into pod netns, the /dev/shm remount)")
	case sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined:
		return errors.New("needs appArmorProfile Unconfined: the runtimes' default profiles deny the /dev/shm remount")
	}
	return nil
}

func TestNRIContainer(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*corev1.Container, *corev1.PodSpec)
		want string
	}{
		{"valid baseline", func(*corev1.Container, *corev1.PodSpec) {}, ""},
		{"unknown flag", func(c *corev1.Container, _ *corev1.PodSpec) { c.Command = append(c.Command, "--shm", "1Gi") }, "flag provided but not defined: -shm"},
		{"bad size", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.Command = []string{"/rdma-netns-nri", "--shm-size", "1GB"}
		}, "--shm-size"},
		{"socket elsewhere", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.Command = setFlag(c.Command, "--socket", "/run/nri/nri.sock")
		}, "/run/nri is not mounted"},
		{"sandbox root not mounted", func(c *corev1.Container, s *corev1.PodSpec) {
			s.InitContainers[0].Command = setFlag(s.InitContainers[0].Command, "--sandbox-root", "/run/containers/storage/overlay-containers")
			c.Command = setFlag(c.Command, "--sandbox-root", "/run/containers/storage/overlay-containers")
		}, "/run/containers/storage/overlay-containers is not mounted"},
		{"netns without propagation", func(c *corev1.Container, _ *corev1.PodSpec) { c.VolumeMounts[1].MountPropagation = nil }, "HostToContainer"},
		{"sandboxes read-only", func(c *corev1.Container, _ *corev1.PodSpec) { c.VolumeMounts[2].ReadOnly = true }, "readOnly true, want false"},
		{"more than it needs", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "state", MountPath: "/var/lib/cni/rdma-netns"})
		}, "does not need it"},
		{"privileged", func(c *corev1.Container, _ *corev1.PodSpec) { p := true; c.SecurityContext.Privileged = &p }, "privileged"},
		{"another capability", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "SYS_PTRACE")
		}, "only SYS_ADMIN"},
		{"no nri container", func(c *corev1.Container, _ *corev1.PodSpec) { c.Command = []string{"/rdma-netns-exporter"} }, "no container runs"},
		{"pre-installed copy sized otherwise", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.Command = setFlag(c.Command, "--shm-size", "2Gi")
		}, "differ from the container's"},
		{"pre-installed copy capped otherwise", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.Command = setFlag(c.Command, "--max-shm-size", "32Gi")
		}, "differ from the container's"},
		{"default above the cap", func(c *corev1.Container, s *corev1.PodSpec) {
			s.InitContainers[0].Command = setFlag(s.InitContainers[0].Command, "--shm-size", "32Gi")
			c.Command = setFlag(c.Command, "--shm-size", "32Gi")
		}, "--shm-size 32Gi is above --max-shm-size 16Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := loadDaemonSet(t).Spec.Template.Spec
			for i := range spec.Containers {
				if spec.Containers[i].Name == "nri" {
					tc.edit(&spec.Containers[i], &spec)
				}
			}
			err := checkNRI(spec)
			wantRejection(t, "daemonset.yaml", err, tc.want)
		})
	}
}

// setFlag is a copy of cmd with the value after flag replaced.
func setFlag(cmd []string, flag, value string) []string {
	cmd = slices.Clone(cmd)
	if i := slices.Index(cmd, flag); i >= 0 && i+1 < len(cmd) {
		cmd[i+1] = value
	}
	return cmd
}

// rdma-netns install recognises the line with which the plugin accepts the
// configuration it installs (the CNI binary does not link the plugin).
func TestInstallKnowsThePluginsCheck(t *testing.T) {
	if install.NRIConfigOK != nriplugin.ConfigOK {
		t.Fatalf("install expects %q, the plugin prints %q", install.NRIConfigOK, nriplugin.ConfigOK)
	}
}
