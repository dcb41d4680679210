package conf

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/kubeauth"
)

const draBinary = "/rdma-netns-dra"

// draFlags are the flags of rdma-netns-dra (cmd/rdma-netns-dra) and their
// defaults; a flag outside them would stop the driver at its start.
var draFlags = map[string]string{
	"node-name":  "$(NODE_NAME)", // the binary's default is $NODE_NAME
	"record-dir": drarecord.DefaultDir,
	"sysfs":      "/sys",
	"kubeconfig": "",
	"rescan":     "30s",
	"cdi-dir":    "/var/run/cdi",
}

// draOptions reads the driver's command line as Go's flag package would
// (-f, --f, -f=v, --f=v, -f v), with the defaults filled in.
func draOptions(args []string) (map[string]string, error) {
	o := map[string]string{}
	for k, v := range draFlags {
		o[k] = v
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("rdma-netns-dra takes no argument %q", a)
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := draFlags[name]; !ok {
			return nil, fmt.Errorf("rdma-netns-dra has no flag %q", a)
		}
		if !hasVal {
			if i+1 == len(args) {
				return nil, fmt.Errorf("flag %q needs a value", a)
			}
			i++
			val = args[i]
		}
		o[name] = val
	}
	return o, nil
}

// draContainer is the container running the DRA driver.
func draContainer(spec corev1.PodSpec) *corev1.Container {
	for i, c := range spec.Containers {
		if len(c.Command) > 0 && c.Command[0] == draBinary {
			return &spec.Containers[i]
		}
	}
	return nil
}

// checkDRA checks the driver's container against what the kubelet and the
// CNI plugin expect of it: the node's name from the downward API, the
// kubelet's two plugin directories and the record directory mounted at
// the host's own paths (the kubelet dials the socket paths the driver
// announces; rdma-netns reads records at drarecord.DefaultDir), the
// ServiceAccount's token where client-go's in-cluster config reads it,
// and no privilege beyond uid 0.
func checkDRA(spec corev1.PodSpec) error {
	c := draContainer(spec)
	o, err := draOptions(c.Command[1:])
	if err != nil {
		return err
	}
	if err := checkNodeName(c, o["node-name"]); err != nil {
		return err
	}
	if o["record-dir"] != drarecord.DefaultDir {
		return fmt.Errorf("--record-dir %s: rdma-netns reads the records at %s alone (a NAD cannot name another)", o["record-dir"], drarecord.DefaultDir)
	}
	if o["kubeconfig"] != "" {
		return fmt.Errorf("--kubeconfig %s: in a pod the driver uses its ServiceAccount", o["kubeconfig"])
	}
	for _, dir := range []string{"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/" + drarecord.DriverName, o["record-dir"]} {
		if err := checkSamePathMount(spec, c, dir); err != nil {
			return err
		}
	}
	// The runtime mounts the container's /sys in the container's network
	// namespace: only with the node's does it show the node's NICs.
	if !spec.HostNetwork {
		return errors.New("the pod is not on the host's network: the driver's /sys would show the pod's own interfaces, not the node's NICs")
	}
	// The runtime reads the CDI specs on the host: the driver must write
	// them into the host's directory, writable.
	if o["cdi-dir"] != "" {
		if err := checkSamePathMount(spec, c, o["cdi-dir"]); err != nil {
			return fmt.Errorf("--cdi-dir: %w", err)
		}
	}
	if o["sysfs"] != "/sys" {
		if err := checkSamePathMount(spec, c, o["sysfs"]); err != nil {
			return fmt.Errorf("--sysfs: %w", err)
		}
	}
	if err := checkToken(spec, c); err != nil {
		return err
	}
	return checkRootNoCaps(c.SecurityContext)
}

// checkNodeName: the driver's node name is the pod's spec.nodeName, either
// through its default ($NODE_NAME) or $(NODE_NAME) on the command line.
func checkNodeName(c *corev1.Container, flag string) error {
	if flag != "$(NODE_NAME)" {
		return fmt.Errorf("--node-name %q: want $(NODE_NAME), the node the pod runs on", flag)
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" })
	if i < 0 {
		return errors.New("no NODE_NAME in the environment: the driver would publish its NICs under no node")
	}
	if f := c.Env[i].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "spec.nodeName" {
		return errors.New("NODE_NAME does not come from the downward API's spec.nodeName")
	}
	return nil
}

// checkSamePathMount: the container mounts host directory dir, writable,
// at dir itself.
func checkSamePathMount(spec corev1.PodSpec, c *corev1.Container, dir string) error {
	m := mountAt(c, dir)
	if m == nil {
		return fmt.Errorf("nothing is mounted at %s", dir)
	}
	if m.ReadOnly {
		return fmt.Errorf("%s is mounted read-only: the driver writes there", dir)
	}
	v := volume(spec, m.Name)
	if v == nil || v.HostPath == nil {
		return fmt.Errorf("%s (volume %s) is not a hostPath volume", dir, m.Name)
	}
	if v.HostPath.Path != dir || m.SubPath != "" {
		return fmt.Errorf("%s is the host's %s: the kubelet and the CNI plugin use the host's own path", dir, path.Join(v.HostPath.Path, m.SubPath))
	}
	return nil
}

// checkToken: the container has the ServiceAccount's token and the
// cluster's CA where client-go's in-cluster config reads them.
func checkToken(spec corev1.PodSpec, c *corev1.Container) error {
	m := mountAt(c, kubeauth.ServiceAccountDir)
	if m == nil {
		return fmt.Errorf("no ServiceAccount token at %s: the driver cannot reach the API server", kubeauth.ServiceAccountDir)
	}
	v := volume(spec, m.Name)
	if v == nil || v.Projected == nil {
		return fmt.Errorf("%s is not a projected volume", kubeauth.ServiceAccountDir)
	}
	var token, ca bool
	for _, s := range v.Projected.Sources {
		token = token || s.ServiceAccountToken != nil && s.ServiceAccountToken.Path == "token"
		if cm := s.ConfigMap; cm != nil && cm.Name == "kube-root-ca.crt" {
			ca = ca || slices.ContainsFunc(cm.Items, func(k corev1.KeyToPath) bool { return k.Key == "ca.crt" && k.Path == "ca.crt" })
		}
	}
	if !token || !ca {
		return fmt.Errorf("volume %s: token %v, ca.crt %v: want both", v.Name, token, ca)
	}
	return nil
}

// driverOnly: the pod runs the DRA driver and nothing else, the
// chart's DaemonSet of dra.enabled.
func driverOnly(spec corev1.PodSpec) bool {
	return len(spec.InitContainers) == 0 && len(spec.Containers) == 1 && draContainer(spec) != nil
}

// checkDriverDaemonSet checks the driver's own DaemonSet: its one
// container runs the image's driver binary as checkDRA wants it, and the
// pod shares no host namespace but the network its /sys needs.
func checkDriverDaemonSet(spec corev1.PodSpec, bins []string) error {
	if !slices.Contains(bins, strings.TrimPrefix(draBinary, "/")) {
		return fmt.Errorf("the image has no %s (the Makefile's IMAGE_BINS)", draBinary)
	}
	if spec.HostPID || spec.HostIPC {
		return fmt.Errorf("hostPID %v, hostIPC %v: the driver looks at no other process", spec.HostPID, spec.HostIPC)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		return errors.New("automountServiceAccountToken is not false: the token goes where the dra container reads it")
	}
	if spec.ServiceAccountName == "" || spec.ServiceAccountName == "default" {
		return fmt.Errorf("serviceAccountName %q: the driver needs one of its own, bound to its role", spec.ServiceAccountName)
	}
	if err := checkDRA(spec); err != nil {
		return fmt.Errorf("container %s: %w", draContainer(spec).Name, err)
	}
	return nil
}

// checkDRARBAC: the driver's ServiceAccount may do what the driver does
// (driverRules, chart_rbac_test.go).
func checkDRARBAC(ns, sa string, r *rbac) error {
	if !slices.ContainsFunc(r.accounts, func(a *corev1.ServiceAccount) bool { return a.Name == sa && a.Namespace == ns }) {
		return fmt.Errorf("ServiceAccount %s/%s is not in the manifest", ns, sa)
	}
	may := accountRules(r, ns, sa)
	for _, w := range driverRules {
		if !slices.Contains(may, w) {
			return fmt.Errorf("ServiceAccount %s/%s may not %s: the DRA driver needs it", ns, sa, w)
		}
	}
	return nil
}

func groupSuffix(g string) string {
	if g == "" {
		return ""
	}
	return "." + g
}

// driverDaemonSet is the rendering's DaemonSet of the DRA driver.
func driverDaemonSet(t *testing.T, objs []object) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objs {
		if ds, ok := o.obj.(*appsv1.DaemonSet); ok && draContainer(ds.Spec.Template.Spec) != nil {
			return ds
		}
	}
	t.Fatalf("no DaemonSet runs %s", draBinary)
	return nil
}

// With dra.enabled the driver runs as the kubelet and the CNI plugin need
// it, in a DaemonSet of its own with the RBAC it needs, on the installer's
// nodes; the installer's DaemonSet keeps its containers, the exporter
// reading the driver's records.
func TestChartDRA(t *testing.T) {
	main, objs := render(t, values("dra.enabled", true))
	ds := driverDaemonSet(t, objs)
	spec := ds.Spec.Template.Spec
	if ds.Name != "rdma-netns-dra" || ds.Namespace != main.Namespace {
		t.Errorf("DaemonSet %s/%s, want %s/rdma-netns-dra", ds.Namespace, ds.Name, main.Namespace)
	}
	if c := container(spec.Containers, "dra"); c == nil || c.Command[0] != draBinary {
		t.Fatalf("no container dra running %s", draBinary)
	}
	if err := checkDriverDaemonSet(spec, []string{strings.TrimPrefix(draBinary, "/")}); err != nil {
		t.Errorf("DaemonSet %s: %v", ds.Name, err)
	}
	var names []string
	for _, c := range main.Spec.Template.Spec.Containers {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"claims-entry", "exporter", "nri"}) {
		t.Errorf("DaemonSet %s: containers %v, want claims-entry, exporter and nri", main.Name, names)
	}
	if m := mountAt(exporterContainer(main.Spec.Template.Spec), drarecord.DefaultDir); m == nil || !m.ReadOnly {
		t.Errorf("the exporter mounts the records at %s: %+v, want read-only", drarecord.DefaultDir, m)
	}
	// The same nodes: scheduling is the chart's, for both.
	m := main.Spec.Template.Spec
	if !maps.Equal(spec.NodeSelector, m.NodeSelector) || !slices.Equal(spec.Tolerations, m.Tolerations) || spec.PriorityClassName != m.PriorityClassName {
		t.Errorf("driver's nodeSelector %v, tolerations %v, priority %q; installer's %v, %v, %q: want the same",
			spec.NodeSelector, spec.Tolerations, spec.PriorityClassName, m.NodeSelector, m.Tolerations, m.PriorityClassName)
	}
	if got := container(spec.Containers, "dra").Resources.Limits.Memory().String(); got != "192Mi" {
		t.Errorf("the dra container's memory limit %s, want dra.resources' 192Mi", got)
	}
	var r rbac
	for _, o := range objs {
		r.add(o.obj)
	}
	for _, d := range []*appsv1.DaemonSet{main, ds} {
		if err := checkRBAC(d, &r); err != nil {
			t.Errorf("DaemonSet %s: %v", d.Name, err)
		}
	}
}

// With dra.enabled the installer appends the claims entry to the primary
// network in the host's CNI configuration directory, once it installed
// the binary (the init container), and keeps it there (a container of its
// own); dra.claimsEntry false, or a DaemonSet without DRA, touches no CNI
// configuration.
func TestChartClaimsEntry(t *testing.T) {
	main, _ := render(t, values("dra.enabled", true, "cniConfDir", "/etc/kubernetes/cni/net.d"))
	spec := main.Spec.Template.Spec
	for _, c := range []*corev1.Container{&spec.InitContainers[0], container(spec.Containers, "claims-entry")} {
		if c == nil {
			t.Fatal("no container claims-entry")
		}
		o, err := installOptions(c.Command[2:])
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if !o.ClaimsEntry || o.CNIConfDir != "/host/etc/kubernetes/cni/net.d" || !slices.Contains(mountPaths(c), o.CNIConfDir) || !slices.Contains(mountPaths(c), o.Dest) {
			t.Errorf("%s: --claims-entry %v --cni-conf-dir %s, mounts %v: want the entry kept in the mounted cniConfDir", c.Name, o.ClaimsEntry, o.CNIConfDir, mountPaths(c))
		}
		if o.ThenWait != (c.Name == "claims-entry") {
			t.Errorf("%s: --then-wait %v: only the container keeps the entry", c.Name, o.ThenWait)
		}
	}
	if v := volume(spec, "cni-conf"); v == nil || v.HostPath.Path != "/etc/kubernetes/cni/net.d" {
		t.Errorf("volume cni-conf %+v, want hostPath /etc/kubernetes/cni/net.d", v)
	}
	for _, vals := range []map[string]any{values("dra.enabled", true, "dra.claimsEntry", false), values("dra.enabled", false)} {
		main, _ := render(t, vals)
		spec := main.Spec.Template.Spec
		o, err := installOptions(spec.InitContainers[0].Command[2:])
		if err != nil || o.ClaimsEntry || volume(spec, "cni-conf") != nil || container(spec.Containers, "claims-entry") != nil {
			t.Errorf("%v: the installer touches the CNI configuration (%+v, %v)", vals, o, err)
		}
	}
}

// The default renders nothing of DRA: no DaemonSet, container, volume,
// token, role or policy.
func TestChartDRAOffByDefault(t *testing.T) {
	for _, vs := range valueSets {
		if vs.vals["dra"] != nil {
			continue
		}
		t.Run(vs.name, func(t *testing.T) {
			ds, objs := renderObjects(t, vs.vals)
			spec := ds.Spec.Template.Spec
			for _, o := range objs {
				if d, ok := o.obj.(*appsv1.DaemonSet); ok && d != ds || strings.HasPrefix(o.kind, "ValidatingAdmissionPolicy") {
					t.Errorf("%s rendered without dra.enabled", o.kind)
				}
			}
			if c := draContainer(spec); c != nil {
				t.Errorf("container %s runs %s", c.Name, draBinary)
			}
			for _, v := range spec.Volumes {
				if strings.HasPrefix(v.Name, "dra-") || v.HostPath != nil && (strings.HasPrefix(v.HostPath.Path, "/var/lib/kubelet") || v.HostPath.Path == drarecord.DefaultDir) {
					t.Errorf("volume %s (%v) rendered without dra.enabled", v.Name, v.HostPath)
				}
			}
			for _, o := range objs {
				if role, ok := o.obj.(*rbacv1.ClusterRole); ok {
					for _, rule := range role.Rules {
						if slices.Contains(rule.APIGroups, "resource.k8s.io") || slices.Contains(rule.Resources, "pods") || slices.Contains(rule.Resources, "nodes") {
							t.Errorf("ClusterRole %s grants %v on %v without dra.enabled", role.Name, rule.Verbs, rule.Resources)
						}
					}
				}
			}
		})
	}
}

// Each way the driver's container could miss what it needs is caught;
// each case edits the chart's rendering with dra.enabled.
func TestDRARejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(spec *corev1.PodSpec, c *corev1.Container)
		want string
	}{
		{"valid baseline", func(*corev1.PodSpec, *corev1.Container) {}, ""},
		{"node name not from the downward API", func(_ *corev1.PodSpec, c *corev1.Container) {
			c.Env[0].ValueFrom.FieldRef.FieldPath = "metadata.name"
		}, "spec.nodeName"},
		{"no NODE_NAME", func(_ *corev1.PodSpec, c *corev1.Container) { c.Env = nil }, "NODE_NAME"},
		{"unknown flag", func(_ *corev1.PodSpec, c *corev1.Container) { c.Command = append(c.Command, "--driver-name=x") }, `no flag "--driver-name=x"`},
		{"record dir the CNI does not read", func(_ *corev1.PodSpec, c *corev1.Container) {
			c.Command = append(c.Command, "--record-dir", "/var/lib/rdma-netns-dra")
		}, "--record-dir /var/lib/rdma-netns-dra"},
		{"registry at another host path", func(spec *corev1.PodSpec, _ *corev1.Container) {
			volume(*spec, "dra-registry").HostPath.Path = "/var/lib/k0s/kubelet/plugins_registry"
		}, "host's /var/lib/k0s/kubelet/plugins_registry"},
		{"plugin directory missing", func(_ *corev1.PodSpec, c *corev1.Container) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dra-plugin" })
		}, "nothing is mounted at /var/lib/kubelet/plugins/nic.rdma-netns.io"},
		{"records read-only", func(_ *corev1.PodSpec, c *corev1.Container) {
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "dra-records" {
					c.VolumeMounts[i].ReadOnly = true
				}
			}
		}, "read-only"},
		{"CDI specs not on the host", func(_ *corev1.PodSpec, c *corev1.Container) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dra-cdi" })
		}, "--cdi-dir: nothing is mounted at /var/run/cdi"},
		{"no token", func(_ *corev1.PodSpec, c *corev1.Container) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dra-token" })
		}, "no ServiceAccount token"},
		{"pod network", func(spec *corev1.PodSpec, _ *corev1.Container) { spec.HostNetwork = false }, "host's network"},
		{"a capability", func(_ *corev1.PodSpec, c *corev1.Container) {
			c.SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, "add none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, objs := renderObjects(t, values("dra.enabled", true))
			spec := &driverDaemonSet(t, objs).Spec.Template.Spec
			tc.edit(spec, draContainer(*spec))
			wantRejection(t, "the chart's dra container", checkDRA(*spec), tc.want)
		})
	}
}

// The RBAC check fails on a role the driver could not work with.
func TestDRARBACRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*rbac)
		want string
	}{
		{"valid baseline", func(*rbac) {}, ""},
		{"no slice deletion", func(r *rbac) {
			for _, role := range r.roles {
				for i := range role.Rules {
					if slices.Contains(role.Rules[i].Resources, "resourceslices") {
						role.Rules[i].Verbs = slices.DeleteFunc(role.Rules[i].Verbs, func(v string) bool { return v == "delete" })
					}
				}
			}
		}, "may not delete resourceslices.resource.k8s.io"},
		{"no claim get", func(r *rbac) {
			for _, role := range r.roles {
				role.Rules = slices.DeleteFunc(role.Rules, func(p rbacv1.PolicyRule) bool { return slices.Contains(p.Resources, "resourceclaims") })
			}
		}, "may not get resourceclaims.resource.k8s.io"},
		{"role not bound", func(r *rbac) {
			r.bindings = slices.DeleteFunc(r.bindings, func(b *rbacv1.ClusterRoleBinding) bool { return strings.HasSuffix(b.Name, "-dra") })
		}, "may not create resourceslices"},
		{"bound to the exporter's account", func(r *rbac) {
			for _, b := range r.bindings {
				if strings.HasSuffix(b.Name, "-dra") {
					b.Subjects[0].Name = "rdma-netns"
				}
			}
		}, "may not create resourceslices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, objs := renderObjects(t, values("dra.enabled", true))
			ds := driverDaemonSet(t, objs)
			var r rbac
			for _, o := range objs {
				r.add(o.obj)
			}
			tc.edit(&r)
			wantRejection(t, "the chart's RBAC", checkDRARBAC(ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName, &r), tc.want)
		})
	}
}
