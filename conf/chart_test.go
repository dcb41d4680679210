package conf

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/rdma-netns/rdma-netns/conf/helmchart"
)

// The files of conf/ that come from the chart are what it renders now:
// the chart is their one source.
func TestGeneratedManifests(t *testing.T) {
	files, err := helmchart.Manifests(helmchart.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		have, err := os.ReadFile(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		if string(have) != f.Data {
			t.Errorf("conf/%s differs from the chart %s rendered: run make manifests (edit the chart, not the file)", f.Name, helmchart.ChartDir)
		}
	}
}

// values builds a values tree from dotted keys, as helm --set does.
func values(kv ...any) map[string]any {
	root := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		keys := strings.Split(kv[i].(string), ".")
		m := root
		for _, k := range keys[:len(keys)-1] {
			if m[k] == nil {
				m[k] = map[string]any{}
			}
			m = m[k].(map[string]any)
		}
		m[keys[len(keys)-1]] = kv[i+1]
	}
	return root
}

// valueSets are the settings an operator changes, each rendered and
// checked below.
var valueSets = []struct {
	name string
	vals map[string]any
}{
	{"defaults", nil},
	{"exporter off", values("exporter.enabled", false)},
	{"nri off", values("nri.enabled", false)},
	{"exporter and nri off", values("exporter.enabled", false, "nri.enabled", false)},
	{"nri not preinstalled", values("nri.preinstalled", false)},
	{"servicemonitor", values("exporter.serviceMonitor.enabled", true, "exporter.port", 9800, "exporter.serviceMonitor.labels", map[string]any{"release": "kube-prometheus-stack"})},
	{"exporter auth off", values("exporter.auth.enabled", false, "exporter.serviceMonitor.enabled", true, "exporter.cacheMaxAge", "0")},
	{"exporter certificate and readers", values("exporter.serviceMonitor.enabled", true, "exporter.auth.tlsSecret", "exporter-tls",
		"exporter.auth.metricsReaders", []any{map[string]any{"name": "prometheus-k8s", "namespace": "monitoring"}},
		"exporter.serviceMonitor.tlsConfig", map[string]any{"serverName": "rdma-netns-exporter"})},
	{"exporter image older than --auth", values("exporter.auth.enabled", nil, "exporter.cacheMaxAge", nil)},
	{"openshift", values("cniBinDir", "/var/lib/cni/bin")},
	{"cri-o", values("nri.sandboxRoot", "/run/containers/storage/overlay-containers")},
	{"nri settings", values("nri.memlock", "64Gi", "nri.shmSize", "16Gi", "nri.maxShmSize", "64Gi", "nri.logLevel", "debug", "nri.index", 20)},
	{"nri image older than --max-shm-size", values("nri.maxShmSize", nil)},
	{"every node", values("rdmaNodeLabel", "")},
	{"dra", values("dra.enabled", true, "dra.resources", map[string]any{"limits": map[string]any{"memory": "256Mi"}})},
	{"another RDMA label", values("rdmaNodeLabel", "example.com/rdma=yes", "nodeSelector", map[string]any{"pool": "training"})},
	{"scheduling", values("nodeSelector", map[string]any{"feature.node.kubernetes.io/rdma.capable": "true"}, "priorityClassName", "",
		"tolerations", []any{}, "imagePullSecrets", []any{map[string]any{"name": "regcred"}}, "image.digest", "sha256:"+strings.Repeat("ab", 32))},
}

// documents are the YAML documents of a manifest, in order, without the
// blank lines around them.
func documents(manifest string) []string {
	var docs []string
	for _, d := range strings.Split(manifest, "\n---\n") {
		docs = append(docs, strings.TrimSpace(strings.TrimPrefix(d, "---\n")))
	}
	return docs
}

// render renders vals with the Helm 4 SDK and decodes every object
// strictly into its Kubernetes type, checking each DaemonSet as the files
// of conf/ are checked (the binaries' own flags, the mounts, privileges),
// and returns the DaemonSet named after the release (the installer's, not
// the DRA driver's) with the objects.
func render(t *testing.T, vals map[string]any) (*appsv1.DaemonSet, []object) {
	t.Helper()
	ds, objs := renderObjects(t, vals)
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.DaemonSet); ok {
			if err := checkDaemonSet(d); err != nil {
				t.Fatalf("rendered DaemonSet %s: %v", d.Name, err)
			}
		}
	}
	return ds, objs
}

// renderObjects is render without the DaemonSets' checks, for values the
// checks rightly refuse (an image older than a flag the binary now has).
func renderObjects(t *testing.T, vals map[string]any) (*appsv1.DaemonSet, []object) {
	t.Helper()
	out, err := helmchart.Render(helmchart.ChartDir, vals)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests("rendered", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.DaemonSet); ok && d.Name == helmchart.ReleaseName {
			ds = d
		}
	}
	if ds == nil {
		t.Fatalf("no DaemonSet %s rendered", helmchart.ReleaseName)
	}
	return ds, objs
}

// Helm 3 and Helm 4 render the chart byte for byte the same, and
// `helm lint --strict` of both finds nothing, with every set of values.
func TestChartHelm3AndHelm4(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			v4, err := helmchart.Render(helmchart.ChartDir, vs.vals)
			if err != nil {
				t.Fatalf("helm 4: %v", err)
			}
			v3, err := renderHelm3(helmchart.ChartDir, vs.vals)
			if err != nil {
				t.Fatalf("helm 3: %v", err)
			}
			// Helm 4 ends each document with one more newline than
			// Helm 3; the YAML is the same.
			if !slices.Equal(documents(v3), documents(v4)) {
				t.Errorf("Helm 3 and Helm 4 render differently:\n--- helm 3\n%s\n--- helm 4\n%s", v3, v4)
			}
			if err := helmchart.Lint(helmchart.ChartDir, vs.vals); err != nil {
				t.Errorf("helm 4 lint: %v", err)
			}
			if err := lintHelm3(helmchart.ChartDir, vs.vals); err != nil {
				t.Errorf("helm 3 lint: %v", err)
			}
		})
	}
}

// A misspelt or misplaced key, or a value the binaries would refuse, fails
// helm install with a message naming it, in Helm 3 and Helm 4, instead of
// being ignored.
func TestChartSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want []string // each in the error
	}{
		{"typo exporter.enable", values("exporter.enable", false), []string{"at '/exporter'", "additional properties 'enable' not allowed"}},
		{"typo at the top", values("nodeSelectors", map[string]any{"a": "b"}), []string{"nodeSelectors"}},
		{"typo in serviceMonitor", values("exporter.serviceMonitor.label", map[string]any{"a": "b"}), []string{"serviceMonitor", "label"}},
		{"port as a string", values("exporter.port", "9761"), []string{"port"}},
		{"relative cniBinDir", values("cniBinDir", "opt/cni/bin"), []string{"cniBinDir"}},
		{"stateDir the plugin never writes", values("stateDir", "/var/lib/rdma-records"), []string{"stateDir"}},
		{"shm size not a quantity", values("nri.shmSize", "1GB"), []string{"shmSize"}},
		{"shm cap keep", values("nri.maxShmSize", "keep"), []string{"maxShmSize"}},
		{"RDMA node label without a value", values("rdmaNodeLabel", "feature.node.kubernetes.io/rdma.capable"), []string{"rdmaNodeLabel"}},
		{"log level", values("nri.logLevel", "verbose"), []string{"logLevel"}},
		{"index of three digits", values("nri.index", "100"), []string{"index"}},
		{"pull policy", values("image.pullPolicy", "IfNotPresnt"), []string{"pullPolicy"}},
		{"typo dra.enable", values("dra.enable", true), []string{"at '/dra'", "additional properties 'enable' not allowed"}},
		{"dra.enabled as a string", values("dra.enabled", "true"), []string{"enabled"}},
		{"servicemonitor without exporter", values("exporter.enabled", false, "exporter.serviceMonitor.enabled", true), []string{"exporter.serviceMonitor.enabled needs exporter.enabled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err4 := helmchart.Render(helmchart.ChartDir, tc.vals)
			_, err3 := renderHelm3(helmchart.ChartDir, tc.vals)
			for v, err := range map[string]error{"helm 4": err4, "helm 3": err3} {
				if err == nil {
					t.Errorf("%s rendered it", v)
					continue
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not name %q", v, err, w)
					}
				}
				t.Logf("%s: %v", v, err)
			}
		})
	}
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func kindsOf(objs []object) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.kind)
	}
	return ks
}

func mountPaths(c *corev1.Container) []string {
	var ps []string
	for _, m := range c.VolumeMounts {
		ps = append(ps, m.MountPath)
	}
	return ps
}

func volume(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// The defaults: an installer, the exporter and the NRI plugin, the plugin
// pre-installed into the runtime, in the release's namespace, the
// exporter's ServiceAccount and RBAC (exporter_test.go), no ServiceMonitor.
func TestChartDefaults(t *testing.T) {
	ds, objs := render(t, nil)
	if want := []string{"ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}; !slices.Equal(kindsOf(objs), want) {
		t.Fatalf("objects %v, want %v", kindsOf(objs), want)
	}
	spec := ds.Spec.Template.Spec
	if ds.Namespace != "kube-system" || ds.Name != "rdma-netns" {
		t.Errorf("DaemonSet %s/%s, want kube-system/rdma-netns", ds.Namespace, ds.Name)
	}
	var names []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"exporter", "nri"}) {
		t.Errorf("containers %v, want exporter and nri", names)
	}
	if nriFlags(spec) == nil {
		t.Error("the init container does not install the NRI plugin (--nri)")
	}
	if spec.PriorityClassName != "system-node-critical" || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("priority class %q, automount token %v", spec.PriorityClassName, spec.AutomountServiceAccountToken)
	}
}

func TestChartExporterOff(t *testing.T) {
	ds, _ := render(t, values("exporter.enabled", false))
	spec := ds.Spec.Template.Spec
	if container(spec.Containers, "exporter") != nil {
		t.Error("an exporter container")
	}
	for _, c := range spec.Containers {
		if len(c.Ports) > 0 {
			t.Errorf("container %s declares ports %v", c.Name, c.Ports)
		}
	}
	if _, ok := ds.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
		t.Error("prometheus.io scrape annotations without the exporter")
	}
	if volume(spec, "state") != nil {
		t.Error("the state directory is mounted without the exporter")
	}
	if container(spec.Containers, "nri") == nil {
		t.Error("the nri container went with the exporter")
	}
}

func TestChartNRIOff(t *testing.T) {
	ds, _ := render(t, values("nri.enabled", false))
	spec := ds.Spec.Template.Spec
	if container(spec.Containers, "nri") != nil {
		t.Error("an nri container")
	}
	if flags := nriFlags(spec); flags != nil || slices.Contains(spec.InitContainers[0].Command, "--nri") {
		t.Errorf("the init container still installs the NRI plugin: %q", spec.InitContainers[0].Command)
	}
	for _, v := range []string{"nri", "nri-plugins", "nri-conf", "sandboxes"} {
		if volume(spec, v) != nil {
			t.Errorf("volume %s without the NRI plugin", v)
		}
	}
}

// With neither the exporter nor the NRI plugin, a container installs and
// idles, so the pod keeps running (checkDaemonSet checks its command).
func TestChartNothingButTheInstaller(t *testing.T) {
	ds, _ := render(t, values("exporter.enabled", false, "nri.enabled", false))
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 || !slices.Contains(spec.Containers[0].Command, "--then-wait") {
		t.Fatalf("containers %v, want one running install --then-wait", spec.Containers)
	}
}

// Not pre-installed: the nri container alone serves, nothing is written
// into the runtime's directories.
func TestChartNRINotPreinstalled(t *testing.T) {
	ds, _ := render(t, values("nri.preinstalled", false))
	spec := ds.Spec.Template.Spec
	if nriFlags(spec) != nil || slices.Contains(spec.InitContainers[0].Command, "--nri") {
		t.Errorf("the init container installs the NRI plugin: %q", spec.InitContainers[0].Command)
	}
	if volume(spec, "nri-plugins") != nil || volume(spec, "nri-conf") != nil {
		t.Error("the runtime's NRI directories are mounted")
	}
	if container(spec.Containers, "nri") == nil {
		t.Error("no nri container")
	}
}

// The NRI settings reach both instances of the plugin (checkDaemonSet
// parses both with the plugin's flags and requires them equal) and the
// index names the installed copy.
func TestChartNRISettings(t *testing.T) {
	ds, _ := render(t, values("nri.memlock", "64Gi", "nri.shmSize", "16Gi", "nri.maxShmSize", "64Gi", "nri.logLevel", "debug", "nri.index", 20))
	spec := ds.Spec.Template.Spec
	o, err := installOptions(spec.InitContainers[0].Command[2:])
	if err != nil {
		t.Fatal(err)
	}
	if o.NRI.Index != "20" {
		t.Errorf("--nri-index %q, want 20", o.NRI.Index)
	}
	want := []string{"--memlock", "64Gi", "--shm-size", "16Gi", "--max-shm-size", "64Gi", "--log-level", "debug"}
	for i := 0; i < len(want); i += 2 {
		j := slices.Index(o.NRI.Flags, want[i])
		if j < 0 || j+1 >= len(o.NRI.Flags) || o.NRI.Flags[j+1] != want[i+1] {
			t.Errorf("the installed plugin's flags %q lack %s %s", o.NRI.Flags, want[i], want[i+1])
		}
	}
}

// nri.maxShmSize null leaves --max-shm-size out of both instances' flags,
// for an image built before the flag (the e2e upgrade installs one).
func TestChartNRIWithoutShmCap(t *testing.T) {
	ds, _ := render(t, values("nri.maxShmSize", nil))
	spec := ds.Spec.Template.Spec
	if slices.Contains(nriFlags(spec), "--max-shm-size") || slices.Contains(container(spec.Containers, "nri").Command, "--max-shm-size") {
		t.Errorf("--max-shm-size passed: init %q, nri %q", nriFlags(spec), container(spec.Containers, "nri").Command)
	}
	def, _ := render(t, nil)
	if i := slices.Index(nriFlags(def.Spec.Template.Spec), "--max-shm-size"); i < 0 || nriFlags(def.Spec.Template.Spec)[i+1] != "16Gi" {
		t.Errorf("the defaults' NRI flags %q, want --max-shm-size 16Gi", nriFlags(def.Spec.Template.Spec))
	}
}

// OpenShift's CNI bin dir: the host directory and where the installer
// writes change together.
func TestChartCNIBinDir(t *testing.T) {
	ds, _ := render(t, values("cniBinDir", "/var/lib/cni/bin"))
	spec := ds.Spec.Template.Spec
	if v := volume(spec, "cni-bin"); v == nil || v.HostPath.Path != "/var/lib/cni/bin" {
		t.Errorf("volume cni-bin %+v, want hostPath /var/lib/cni/bin", v)
	}
	o, err := installOptions(spec.InitContainers[0].Command[2:])
	if err != nil {
		t.Fatal(err)
	}
	if o.Dest != "/host/var/lib/cni/bin" || !slices.Contains(mountPaths(&spec.InitContainers[0]), o.Dest) {
		t.Errorf("--dest %s, mounts %v: want /host/var/lib/cni/bin mounted", o.Dest, mountPaths(&spec.InitContainers[0]))
	}
}

// CRI-O keeps the pods' /dev/shm elsewhere: the nri container mounts that
// directory and both instances of the plugin look there.
func TestChartCRIOSandboxRoot(t *testing.T) {
	const crio = "/run/containers/storage/overlay-containers"
	ds, _ := render(t, values("nri.sandboxRoot", crio))
	spec := ds.Spec.Template.Spec
	nri := container(spec.Containers, "nri")
	if !slices.Contains(mountPaths(nri), crio) || slices.Contains(mountPaths(nri), "/run/containerd/io.containerd.grpc.v1.cri/sandboxes") {
		t.Errorf("nri mounts %v, want %s and not containerd's", mountPaths(nri), crio)
	}
	if v := volume(spec, "sandboxes"); v == nil || v.HostPath.Path != crio {
		t.Errorf("volume sandboxes %+v, want hostPath %s", v, crio)
	}
	if i := slices.Index(nriFlags(spec), "--sandbox-root"); i < 0 || nriFlags(spec)[i+1] != crio {
		t.Errorf("the installed plugin's flags %q, want --sandbox-root %s", nriFlags(spec), crio)
	}
}

// The ServiceMonitor scrapes the exporter's port, with the labels the
// operator's Prometheus selects, in the release's namespace.
func TestChartServiceMonitor(t *testing.T) {
	ds, objs := render(t, values("exporter.serviceMonitor.enabled", true, "exporter.port", 9800,
		"exporter.serviceMonitor.labels", map[string]any{"release": "kube-prometheus-stack"}))
	var svc *corev1.Service
	var sm *serviceMonitor
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *corev1.Service:
			svc = obj
		case *serviceMonitor:
			sm = obj
		}
	}
	if svc == nil || sm == nil {
		t.Fatalf("objects %v, want a Service and a ServiceMonitor", kindsOf(objs))
	}
	if err := checkServiceTargets(svc, []*appsv1.DaemonSet{ds}); err != nil {
		t.Error(err)
	}
	if err := checkServiceMonitor(sm, []*corev1.Service{svc}); err != nil {
		t.Error(err)
	}
	if sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v", sm.Labels)
	}
	exp := container(ds.Spec.Template.Spec.Containers, "exporter")
	if exp.Ports[0].ContainerPort != 9800 || !slices.Contains(exp.Command, ":9800") || ds.Spec.Template.Annotations["prometheus.io/port"] != "9800" {
		t.Errorf("exporter port %v, command %q, annotation %q: want 9800 everywhere", exp.Ports, exp.Command, ds.Spec.Template.Annotations["prometheus.io/port"])
	}
}

// Scheduling and image values land where Kubernetes reads them.
func TestChartSchedulingAndImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	ds, _ := render(t, values("nodeSelector", map[string]any{"feature.node.kubernetes.io/rdma.capable": "true"},
		"priorityClassName", "", "tolerations", []any{}, "imagePullSecrets", []any{map[string]any{"name": "regcred"}},
		"image.digest", digest, "image.pullPolicy", "Always"))
	spec := ds.Spec.Template.Spec
	if spec.NodeSelector["feature.node.kubernetes.io/rdma.capable"] != "true" {
		t.Errorf("nodeSelector %v", spec.NodeSelector)
	}
	if spec.PriorityClassName != "" || len(spec.Tolerations) != 0 {
		t.Errorf("priority class %q, tolerations %v: want none", spec.PriorityClassName, spec.Tolerations)
	}
	if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("imagePullSecrets %v", spec.ImagePullSecrets)
	}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != "ghcr.io/rdma-netns/rdma-netns@"+digest || c.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("container %s: image %s, pull policy %s", c.Name, c.Image, c.ImagePullPolicy)
		}
	}
}

// By default the DaemonSet runs on RDMA nodes only, those with Node Feature
// Discovery's label, and tolerates no taint but the GPU nodes' and
// not-ready (a node whose default network waits for the binary): none with
// an empty key, which would tolerate every taint.
func TestChartRDMANodesOnly(t *testing.T) {
	ds, _ := render(t, nil)
	spec := ds.Spec.Template.Spec
	if want := map[string]string{"feature.node.kubernetes.io/rdma.capable": "true"}; !maps.Equal(spec.NodeSelector, want) {
		t.Errorf("nodeSelector %v, want %v", spec.NodeSelector, want)
	}
	var keys []string
	for _, tol := range spec.Tolerations {
		keys = append(keys, tol.Key+":"+string(tol.Effect))
	}
	if want := []string{"nvidia.com/gpu:NoSchedule", "node.kubernetes.io/not-ready:NoSchedule"}; !slices.Equal(keys, want) {
		t.Errorf("tolerations %v, want %v", keys, want)
	}
	for _, tc := range []struct {
		vals map[string]any
		want map[string]string
	}{
		{values("rdmaNodeLabel", ""), nil},
		{values("rdmaNodeLabel", "example.com/rdma="), map[string]string{"example.com/rdma": ""}},
		{values("rdmaNodeLabel", "example.com/rdma=yes", "nodeSelector", map[string]any{"pool": "training"}), map[string]string{"example.com/rdma": "yes", "pool": "training"}},
		{values("nodeSelector", map[string]any{"feature.node.kubernetes.io/rdma.capable": "false"}), map[string]string{"feature.node.kubernetes.io/rdma.capable": "false"}},
	} {
		ds, _ := render(t, tc.vals)
		if got := ds.Spec.Template.Spec.NodeSelector; !maps.Equal(got, tc.want) {
			t.Errorf("values %v: nodeSelector %v, want %v", tc.vals, got, tc.want)
		}
	}
}

// helm lint finds what it should in a copy of the chart with a broken
// Chart.yaml, in Helm 3 and Helm 4: a clean lint above means something.
func TestChartLintFindsProblems(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rdma-netns")
	if err := os.CopyFS(dir, os.DirFS(helmchart.ChartDir)); err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	broken := regexp.MustCompile(`(?m)^version: .*$`).ReplaceAll(meta, []byte("version: first"))
	if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), broken, 0o644); err != nil {
		t.Fatal(err)
	}
	for v, lint := range map[string]func(string, map[string]any) error{"helm 4": helmchart.Lint, "helm 3": lintHelm3} {
		err := lint(dir, nil)
		if err == nil || !strings.Contains(err.Error(), "first") {
			t.Errorf("%s lint of a chart with version %q: %v", v, "first", err)
		}
		t.Logf("%s: %v", v, err)
	}
}

// The objects go to the release's namespace, named after the release, and
// the ServiceMonitor looks for the Service there.
func TestChartReleaseNamespace(t *testing.T) {
	out, err := helmchart.RenderRelease(helmchart.ChartDir, "rdma", "rdma-system", values("exporter.serviceMonitor.enabled", true))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests("rendered", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *appsv1.DaemonSet:
			if obj.Namespace != "rdma-system" || obj.Name != "rdma-rdma-netns" {
				t.Errorf("DaemonSet %s/%s, want rdma-system/rdma-rdma-netns", obj.Namespace, obj.Name)
			}
		case *corev1.Service:
			if obj.Namespace != "rdma-system" {
				t.Errorf("Service in %s", obj.Namespace)
			}
		case *serviceMonitor:
			if obj.Namespace != "rdma-system" || !slices.Equal(obj.Spec.NamespaceSelector.MatchNames, []string{"rdma-system"}) {
				t.Errorf("ServiceMonitor in %s watching %v", obj.Namespace, obj.Spec.NamespaceSelector.MatchNames)
			}
		case *corev1.ServiceAccount:
			if obj.Namespace != "rdma-system" || obj.Name != "rdma-rdma-netns" {
				t.Errorf("ServiceAccount %s/%s, want rdma-system/rdma-rdma-netns", obj.Namespace, obj.Name)
			}
		case *rbacv1.ClusterRole:
			// Cluster-wide: named after the release, so two releases
			// do not share one.
			if !strings.HasPrefix(obj.Name, "rdma-rdma-netns-") {
				t.Errorf("ClusterRole %s not named after the release", obj.Name)
			}
		case *rbacv1.ClusterRoleBinding:
			if !strings.HasPrefix(obj.Name, "rdma-rdma-netns-") || obj.Subjects[0].Namespace != "rdma-system" {
				t.Errorf("ClusterRoleBinding %s binds %+v", obj.Name, obj.Subjects)
			}
		}
	}
	if len(objs) != 7 {
		t.Errorf("objects %v, want the DaemonSet, Service, ServiceMonitor, and the exporter's ServiceAccount, two ClusterRoles and a binding", kindsOf(objs))
	}
}

// A DaemonSet whose pod names a ServiceAccount the release does not
// create never gets a pod ("serviceaccount not found" in its events, as
// e2e-k8s's TestHelm saw with the exporter off, then after a rollback):
// with every set of values it names the same account, and renders it.
func TestChartServiceAccountRendered(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			ds, objs := renderObjects(t, vs.vals)
			// Every set names the same account (serviceaccount.yaml: a pod
			// template keeps a name once given, so a rollback or upgrade
			// between any two sets must find it).
			name := ds.Spec.Template.Spec.ServiceAccountName
			if name != helmchart.ReleaseName {
				t.Errorf("the DaemonSet's pods run as ServiceAccount %q, want %s whatever the values", name, helmchart.ReleaseName)
			}
			for _, o := range objs {
				if sa, ok := o.obj.(*corev1.ServiceAccount); ok && sa.Name == name && sa.Namespace == ds.Namespace {
					return
				}
			}
			t.Errorf("the DaemonSet's pods run as ServiceAccount %s/%s, which the chart does not render", ds.Namespace, name)
		})
	}
}
