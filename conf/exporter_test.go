package conf

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/rdma-netns/rdma-netns/pkg/exporter"
	"github.com/rdma-netns/rdma-netns/pkg/kubeauth"
)

// exporterOptions parses the exporter container's command with the
// binary's own flags, as it will.
func exporterOptions(c *corev1.Container) (exporter.Options, error) {
	var o exporter.Options
	fl := exporter.FlagSet(&o)
	fl.SetOutput(io.Discard)
	if err := fl.Parse(c.Command[1:]); err != nil {
		return o, fmt.Errorf("rdma-netns-exporter %q: %w", c.Command[1:], err)
	}
	if fl.NArg() > 0 {
		return o, fmt.Errorf("rdma-netns-exporter takes no argument %q", fl.Arg(0))
	}
	return o, o.Check()
}

// exporterContainer is the container running /rdma-netns-exporter.
func exporterContainer(spec corev1.PodSpec) *corev1.Container {
	for i, c := range spec.Containers {
		if len(c.Command) > 0 && c.Command[0] == "/rdma-netns-exporter" {
			return &spec.Containers[i]
		}
	}
	return nil
}

// checkExporter checks the exporter container against its flags: it
// listens on its metrics port, reads the state directory, and with
// --auth kubernetes it alone holds a ServiceAccount token where
// kubeauth.InCluster reads it, and its probes speak the HTTPS it serves.
func checkExporter(spec corev1.PodSpec) error {
	c := exporterContainer(spec)
	o, err := exporterOptions(c)
	if err != nil {
		return err
	}
	_, port, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", o.Listen, err)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "metrics" && strconv.Itoa(int(p.ContainerPort)) == port
	}) {
		return fmt.Errorf("--listen %s is not the container's metrics port %v", o.Listen, c.Ports)
	}
	if m := mountAt(c, o.StateDir); m == nil || !m.ReadOnly {
		return fmt.Errorf("--state-dir %s is not mounted read-only", o.StateDir)
	}
	if err := checkExporterToken(spec, c, o); err != nil {
		return err
	}
	tls := o.Auth == exporter.AuthKubernetes || o.TLSCert != ""
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
			return fmt.Errorf("%s probe %+v, want GET /healthz", name, p)
		}
		if https := p.HTTPGet.Scheme == corev1.URISchemeHTTPS; https != tls {
			return fmt.Errorf("%s probe scheme %q, but the exporter serves HTTPS: %v", name, p.HTTPGet.Scheme, tls)
		}
	}
	for _, f := range []string{o.TLSCert, o.TLSKey} {
		if f != "" && mountAt(c, filepath.Dir(f)) == nil {
			return fmt.Errorf("%s is in no volume of the exporter container", f)
		}
	}
	return nil
}

// checkExporterToken: with --auth kubernetes the exporter container, and
// no other, mounts a projected ServiceAccount token and the cluster's CA
// at kubeauth.ServiceAccountDir, under the pod's own ServiceAccount.
func checkExporterToken(spec corev1.PodSpec, c *corev1.Container, o exporter.Options) error {
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		return errors.New("automountServiceAccountToken is not false: every container would hold the token")
	}
	for _, other := range append(spec.InitContainers, spec.Containers...) {
		if other.Name != c.Name && mountAt(&other, kubeauth.ServiceAccountDir) != nil {
			return fmt.Errorf("container %s mounts a ServiceAccount token it has no use for", other.Name)
		}
	}
	m := mountAt(c, kubeauth.ServiceAccountDir)
	if o.Auth != exporter.AuthKubernetes {
		if m != nil {
			return fmt.Errorf("--auth %s, yet the exporter mounts a ServiceAccount token", o.Auth)
		}
		return nil
	}
	if spec.ServiceAccountName == "" || spec.ServiceAccountName == "default" {
		return fmt.Errorf("serviceAccountName %q: the exporter needs one of its own, bound to create reviews", spec.ServiceAccountName)
	}
	if m == nil {
		return fmt.Errorf("--auth kubernetes, but nothing is mounted at %s", kubeauth.ServiceAccountDir)
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
		return fmt.Errorf("volume %s: token %v, ca.crt %v: want both, as kubeauth.InCluster reads them", v.Name, token, ca)
	}
	return nil
}

// mountAt is the container's mount at path.
func mountAt(c *corev1.Container, path string) *corev1.VolumeMount {
	for i, m := range c.VolumeMounts {
		if m.MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// rbac are the ServiceAccounts and RBAC objects of a manifest.
type rbac struct {
	accounts []*corev1.ServiceAccount
	roles    []*rbacv1.ClusterRole
	bindings []*rbacv1.ClusterRoleBinding
}

func (r *rbac) add(obj any) {
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		r.accounts = append(r.accounts, o)
	case *rbacv1.ClusterRole:
		r.roles = append(r.roles, o)
	case *rbacv1.ClusterRoleBinding:
		r.bindings = append(r.bindings, o)
	}
}

// allows: some rule of role lets verb resource in group.
func allows(role *rbacv1.ClusterRole, group, resource, verb string) bool {
	return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb)
	})
}

func allowsURL(role *rbacv1.ClusterRole, url, verb string) bool {
	return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.NonResourceURLs, url) && slices.Contains(r.Verbs, verb)
	})
}

// rolesOf are the ClusterRoles bound to the ServiceAccount ns/name.
func (r *rbac) rolesOf(ns, name string) []*rbacv1.ClusterRole {
	var out []*rbacv1.ClusterRole
	for _, b := range r.bindings {
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Namespace == ns && s.Name == name
		}) || b.RoleRef.Kind != "ClusterRole" {
			continue
		}
		for _, role := range r.roles {
			if role.Name == b.RoleRef.Name {
				out = append(out, role)
			}
		}
	}
	return out
}

// checkRBAC: a DaemonSet whose exporter reviews tokens runs as a
// ServiceAccount of the manifest that may create TokenReviews and
// SubjectAccessReviews, and the manifest has a ClusterRole granting what
// those reviews ask of a scraper: get on /metrics.
func checkRBAC(ds *appsv1.DaemonSet, r *rbac) error {
	spec := ds.Spec.Template.Spec
	if draContainer(spec) != nil {
		if err := checkDRARBAC(ds.Namespace, spec.ServiceAccountName, r); err != nil {
			return err
		}
	}
	c := exporterContainer(spec)
	if c == nil {
		return nil
	}
	if o, err := exporterOptions(c); err != nil || o.Auth != exporter.AuthKubernetes {
		return err
	}
	sa := spec.ServiceAccountName
	if !slices.ContainsFunc(r.accounts, func(a *corev1.ServiceAccount) bool { return a.Name == sa && a.Namespace == ds.Namespace }) {
		return fmt.Errorf("ServiceAccount %s/%s is not in the manifest", ds.Namespace, sa)
	}
	roles := r.rolesOf(ds.Namespace, sa)
	for _, want := range [][2]string{{"authentication.k8s.io", "tokenreviews"}, {"authorization.k8s.io", "subjectaccessreviews"}} {
		if !slices.ContainsFunc(roles, func(role *rbacv1.ClusterRole) bool { return allows(role, want[0], want[1], "create") }) {
			return fmt.Errorf("ServiceAccount %s/%s may not create %s.%s: every scrape would get 503", ds.Namespace, sa, want[1], want[0])
		}
	}
	if !slices.ContainsFunc(r.roles, func(role *rbacv1.ClusterRole) bool { return allowsURL(role, "/metrics", "get") }) {
		return errors.New("no ClusterRole grants get on /metrics: nothing to bind Prometheus to")
	}
	return nil
}

// Every way the exporter's container could disagree with its flags is
// caught; each case edits the real daemonset.yaml.
func TestExporterRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*corev1.Container, *corev1.PodSpec)
		want string
	}{
		{"valid baseline", func(*corev1.Container, *corev1.PodSpec) {}, ""},
		{"unknown flag", func(c *corev1.Container, _ *corev1.PodSpec) { c.Command = append(c.Command, "--auth-mode", "rbac") }, "flag provided but not defined: -auth-mode"},
		{"auth mode", func(c *corev1.Container, _ *corev1.PodSpec) { c.Command = setFlag(c.Command, "--auth", "basic") }, `--auth "basic"`},
		{"another port", func(c *corev1.Container, _ *corev1.PodSpec) { c.Command = setFlag(c.Command, "--listen", ":9800") }, "metrics port"},
		{"no token", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == kubeauth.ServiceAccountDir })
		}, "nothing is mounted at"},
		{"token everywhere", func(_ *corev1.Container, s *corev1.PodSpec) { s.AutomountServiceAccountToken = nil }, "automountServiceAccountToken"},
		{"token in nri", func(c *corev1.Container, s *corev1.PodSpec) {
			n := container(s.Containers, "nri")
			n.VolumeMounts = append(n.VolumeMounts, *mountAt(c, kubeauth.ServiceAccountDir))
		}, "container nri mounts a ServiceAccount token"},
		{"default ServiceAccount", func(_ *corev1.Container, s *corev1.PodSpec) { s.ServiceAccountName = "" }, "serviceAccountName"},
		{"probe over HTTP", func(c *corev1.Container, _ *corev1.PodSpec) { c.ReadinessProbe.HTTPGet.Scheme = "" }, "serves HTTPS: true"},
		{"auth off, probe over HTTPS", func(c *corev1.Container, _ *corev1.PodSpec) {
			c.Command = setFlag(c.Command, "--auth", "none")
		}, "mounts a ServiceAccount token"},
		{"negative cache age", func(c *corev1.Container, _ *corev1.PodSpec) { c.Command = setFlag(c.Command, "--cache-max-age", "-1s") }, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := loadDaemonSet(t).Spec.Template.Spec
			tc.edit(exporterContainer(spec), &spec)
			err := checkExporter(spec)
			wantRejection(t, "daemonset.yaml", err, tc.want)
		})
	}
}

// The chart's defaults: the exporter reviews tokens as a ServiceAccount of
// its own that may create reviews and nothing else, serves HTTPS, and the
// ServiceMonitor scrapes it so with Prometheus's token.
func TestChartExporterAuth(t *testing.T) {
	ds, objs := render(t, values("exporter.serviceMonitor.enabled", true))
	var r rbac
	var sm *serviceMonitor
	for _, o := range objs {
		r.add(o.obj)
		if s, ok := o.obj.(*serviceMonitor); ok {
			sm = s
		}
	}
	if err := checkRBAC(ds, &r); err != nil {
		t.Error(err)
	}
	o, _ := exporterOptions(exporterContainer(ds.Spec.Template.Spec))
	if o.Auth != exporter.AuthKubernetes || o.MaxAge != exporter.DefaultMaxAge || o.AuthCacheTTL != kubeauth.DefaultCacheTTL {
		t.Errorf("exporter options %+v, want --auth kubernetes and the binary's default ages", o)
	}
	// The exporter's role is the reviews, nothing more.
	for _, role := range r.rolesOf(ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName) {
		for _, rule := range role.Rules {
			if !slices.Equal(rule.Verbs, []string{"create"}) || len(rule.Resources) != 1 || !strings.HasSuffix(rule.Resources[0], "reviews") {
				t.Errorf("ClusterRole %s grants the exporter %+v: more than the reviews", role.Name, rule)
			}
		}
	}
	if len(r.bindings) != 1 {
		t.Errorf("%d ClusterRoleBindings, want the exporter's only (metricsReaders is empty)", len(r.bindings))
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Scheme != "https" || ep.TLSConfig["insecureSkipVerify"] != true || ep.BearerTokenFile != kubeauth.ServiceAccountDir+"/token" {
		t.Errorf("ServiceMonitor endpoint scheme %q, tlsConfig %v, bearerTokenFile %q: want https, insecureSkipVerify (self-signed) and Prometheus's token", ep.Scheme, ep.TLSConfig, ep.BearerTokenFile)
	}
	if ds.Spec.Template.Annotations["prometheus.io/scheme"] != "https" {
		t.Errorf("annotations %v, want prometheus.io/scheme https", ds.Spec.Template.Annotations)
	}
}

// metricsReaders are bound to the metrics-reader role; a tlsSecret is
// served and the ServiceMonitor verifies it with the tlsConfig given, and
// sends the authorization given instead of Prometheus's token file.
func TestChartExporterReadersAndCertificate(t *testing.T) {
	ds, objs := render(t, values("exporter.serviceMonitor.enabled", true,
		"exporter.auth.metricsReaders", []any{map[string]any{"name": "prometheus-k8s", "namespace": "monitoring"}},
		"exporter.auth.tlsSecret", "exporter-tls", "exporter.auth.cacheTTL", "30s", "exporter.cacheMaxAge", "5s",
		"exporter.serviceMonitor.tlsConfig", map[string]any{"serverName": "rdma-netns-exporter", "ca": map[string]any{"secret": map[string]any{"name": "exporter-tls", "key": "ca.crt"}}},
		"exporter.serviceMonitor.authorization", map[string]any{"type": "Bearer", "credentials": map[string]any{"name": "prometheus-token", "key": "token"}}))
	var r rbac
	var sm *serviceMonitor
	for _, o := range objs {
		r.add(o.obj)
		if s, ok := o.obj.(*serviceMonitor); ok {
			sm = s
		}
	}
	if !slices.ContainsFunc(r.rolesOf("monitoring", "prometheus-k8s"), func(role *rbacv1.ClusterRole) bool { return allowsURL(role, "/metrics", "get") }) {
		t.Error("monitoring/prometheus-k8s may not get /metrics")
	}
	spec := ds.Spec.Template.Spec
	o, _ := exporterOptions(exporterContainer(spec))
	if o.AuthCacheTTL.String() != "30s" || o.MaxAge.String() != "5s" || o.TLSCert == "" {
		t.Errorf("exporter options %+v, want --auth-cache-ttl 30s, --cache-max-age 5s and the Secret's certificate", o)
	}
	v := volume(spec, mountAt(exporterContainer(spec), filepath.Dir(o.TLSCert)).Name)
	if v.Secret == nil || v.Secret.SecretName != "exporter-tls" {
		t.Errorf("--tls-cert-file %s is in volume %+v, want Secret exporter-tls", o.TLSCert, v)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Scheme != "https" || ep.TLSConfig["insecureSkipVerify"] != nil || ep.TLSConfig["serverName"] != "rdma-netns-exporter" {
		t.Errorf("ServiceMonitor tlsConfig %v, want the one given, not insecureSkipVerify", ep.TLSConfig)
	}
	if ep.BearerTokenFile != "" || ep.Authorization["type"] != "Bearer" {
		t.Errorf("ServiceMonitor bearerTokenFile %q, authorization %v: want the authorization given instead", ep.BearerTokenFile, ep.Authorization)
	}
}

// auth.enabled false serves everyone over HTTP: no token, no RBAC; null
// (an image older than authentication) leaves the flags out too.
func TestChartExporterAuthOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		auth []string // the --auth flag, if any
	}{
		{"off", values("exporter.auth.enabled", false, "exporter.serviceMonitor.enabled", true), []string{"--auth", "none"}},
		{"older image", values("exporter.auth.enabled", nil, "exporter.cacheMaxAge", nil, "exporter.serviceMonitor.enabled", true), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not render: this build's exporter, without --auth, reviews
			// tokens and would lack its token (only an older image runs
			// so); checkExporter would rightly refuse it.
			ds, objs := renderObjects(t, tc.vals)
			for _, o := range objs {
				if strings.HasPrefix(o.kind, "ClusterRole") {
					t.Errorf("%s rendered", o.kind)
				}
				if sm, ok := o.obj.(*serviceMonitor); ok && (sm.Spec.Endpoints[0].Scheme != "" || sm.Spec.Endpoints[0].BearerTokenFile != "") {
					t.Errorf("ServiceMonitor endpoint %+v, want plain HTTP without a token", sm.Spec.Endpoints[0])
				}
			}
			if tc.auth != nil {
				if err := checkDaemonSet(ds); err != nil {
					t.Error(err)
				}
			}
			c := exporterContainer(ds.Spec.Template.Spec)
			i := slices.Index(c.Command, "--auth")
			if got := c.Command[max(i, 0):min(max(i+2, 0), len(c.Command))]; i < 0 && tc.auth != nil || i >= 0 && !slices.Equal(got, tc.auth) {
				t.Errorf("exporter command %q, want %q", c.Command, tc.auth)
			}
			if tc.auth == nil && slices.ContainsFunc(c.Command, func(a string) bool { return strings.HasPrefix(a, "--cache-max-age") || strings.HasPrefix(a, "--auth") }) {
				t.Errorf("exporter command %q has flags an older image does not know", c.Command)
			}
			// The account stays (serviceaccount.yaml says why), with no
			// role and its token mounted nowhere.
			if spec := ds.Spec.Template.Spec; slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Projected != nil }) {
				t.Errorf("a projected volume (the ServiceAccount's token) without authentication: %+v", spec.Volumes)
			}
		})
	}
}
