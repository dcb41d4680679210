package conf

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/kubeauth"
)

// The RBAC of each part, exactly: what its code calls and nothing more.
//
// The exporter (pkg/kubeauth) POSTs TokenReviews and SubjectAccessReviews,
// nothing else. The NRI plugin and the installer never talk to the API
// server. The DRA driver is k8s.io/dynamic-resource-allocation v0.37.2's
// kubeletplugin: NodePrepareResources GETs each claim the kubelet names
// (getResourceClaims), and its ResourceSlice controller lists and watches
// the node's slices of the driver (field selector), creates, updates and
// deletes them (preconditions on UID and resourceVersion, no patch), and
// GETs its Node once for the slices' owner reference. It records no event
// and reads no pod: the claim names the pod it is reserved for.
// cmd/rdma-netns-dra's TestAPICalls holds the driver to the same list.
var (
	exporterRules = []string{
		"create subjectaccessreviews.authorization.k8s.io",
		"create tokenreviews.authentication.k8s.io",
	}
	metricsReaderRules = []string{"get /metrics"}
	driverRules        = []string{
		"create resourceslices.resource.k8s.io",
		"delete resourceslices.resource.k8s.io",
		"get nodes",
		"get resourceclaims.resource.k8s.io",
		"list resourceslices.resource.k8s.io",
		"update resourceslices.resource.k8s.io",
		"watch resourceslices.resource.k8s.io",
	}
)

// The driver's objects for release rdma-netns in kube-system.
const (
	driverAccount = "rdma-netns-dra"
	driverUser    = "system:serviceaccount:kube-system:" + driverAccount
	slicePolicy   = "rdma-netns-dra-slices"
)

// ruleStrings expands rules into one "verb resource.group" (or "verb
// URL") per verb, resource and group, sorted; a rule naming resources
// by name says so, as "verb resource.group/name".
func ruleStrings(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, v := range r.Verbs {
			for _, u := range r.NonResourceURLs {
				out = append(out, v+" "+u)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					s := v + " " + res + groupSuffix(g)
					if len(r.ResourceNames) == 0 {
						out = append(out, s)
					}
					for _, n := range r.ResourceNames {
						out = append(out, s+"/"+n)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// chartRBAC is what a rendering grants: each role's rules, each binding's
// role and subjects, and any namespaced Role or RoleBinding by name.
type chartRBAC struct {
	roles    map[string][]string // ClusterRole name -> ruleStrings
	bindings map[string]string   // ClusterRoleBinding name -> "role <- subjects"
	other    []string            // Roles and RoleBindings: the chart has none
}

func rbacOf(objs []object) chartRBAC {
	c := chartRBAC{roles: map[string][]string{}, bindings: map[string]string{}}
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *rbacv1.ClusterRole:
			c.roles[obj.Name] = ruleStrings(obj.Rules)
		case *rbacv1.ClusterRoleBinding:
			var subjects []string
			for _, s := range obj.Subjects {
				subjects = append(subjects, s.Kind+" "+s.Namespace+"/"+s.Name)
			}
			c.bindings[obj.Name] = obj.RoleRef.Kind + " " + obj.RoleRef.Name + " <- " + strings.Join(subjects, ", ")
		case *rbacv1.Role, *rbacv1.RoleBinding:
			c.other = append(c.other, o.kind)
		}
	}
	return c
}

// accountRules is everything the ServiceAccount ns/name may do through the
// rendering's bindings, sorted.
func accountRules(r *rbac, ns, name string) []string {
	var out []string
	for _, role := range r.rolesOf(ns, name) {
		out = append(out, ruleStrings(role.Rules)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// The chart grants each role exactly its rules and binds each to its
// account alone: with dra.enabled the driver's role, on an account of its
// own, adds exactly what the driver calls; the exporter's account keeps
// the reviews. No pods, no claims beyond get, no events, no patch.
func TestChartRBACExact(t *testing.T) {
	for _, tc := range []struct {
		name     string
		vals     map[string]any
		roles    map[string][]string
		bindings map[string]string
	}{
		{"defaults", nil,
			map[string][]string{"rdma-netns-exporter-auth": exporterRules, "rdma-netns-metrics-reader": metricsReaderRules},
			map[string]string{"rdma-netns-exporter-auth": "ClusterRole rdma-netns-exporter-auth <- ServiceAccount kube-system/rdma-netns"}},
		{"dra", values("dra.enabled", true),
			map[string][]string{"rdma-netns-exporter-auth": exporterRules, "rdma-netns-metrics-reader": metricsReaderRules, driverAccount: driverRules},
			map[string]string{
				"rdma-netns-exporter-auth": "ClusterRole rdma-netns-exporter-auth <- ServiceAccount kube-system/rdma-netns",
				driverAccount:              "ClusterRole rdma-netns-dra <- ServiceAccount kube-system/rdma-netns-dra",
			}},
		{"dra, exporter auth off", values("dra.enabled", true, "exporter.auth.enabled", false),
			map[string][]string{driverAccount: driverRules},
			map[string]string{driverAccount: "ClusterRole rdma-netns-dra <- ServiceAccount kube-system/rdma-netns-dra"}},
		{"dra, exporter off", values("dra.enabled", true, "exporter.enabled", false),
			map[string][]string{driverAccount: driverRules},
			map[string]string{driverAccount: "ClusterRole rdma-netns-dra <- ServiceAccount kube-system/rdma-netns-dra"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, objs := renderObjects(t, tc.vals)
			got := rbacOf(objs)
			if !maps.EqualFunc(got.roles, tc.roles, slices.Equal) {
				t.Errorf("ClusterRoles:\n%s\nwant:\n%s", showRoles(got.roles), showRoles(tc.roles))
			}
			if !maps.Equal(got.bindings, tc.bindings) {
				t.Errorf("ClusterRoleBindings %v, want %v", got.bindings, tc.bindings)
			}
			if len(got.other) > 0 {
				t.Errorf("namespaced RBAC %v: the chart has none", got.other)
			}
		})
	}
}

func showRoles(roles map[string][]string) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(roles)) {
		fmt.Fprintf(&b, "  %s: %q\n", name, roles[name])
	}
	return b.String()
}

// daemonSets are the rendering's DaemonSets by name.
func daemonSets(objs []object) map[string]*appsv1.DaemonSet {
	out := map[string]*appsv1.DaemonSet{}
	for _, o := range objs {
		if ds, ok := o.obj.(*appsv1.DaemonSet); ok {
			out[ds.Name] = ds
		}
	}
	return out
}

// tokenHolders are the containers of the pod that mount a ServiceAccount
// token, sorted.
func tokenHolders(spec corev1.PodSpec) []string {
	var out []string
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if mountAt(&c, kubeauth.ServiceAccountDir) != nil {
			out = append(out, c.Name)
		}
	}
	slices.Sort(out)
	return out
}

// With dra.enabled the driver runs in a DaemonSet of its own, as a
// ServiceAccount of its own, its token in the dra container alone; the
// network-facing exporter's pod holds the exporter's token only, which may
// create reviews and nothing else. The driver's pod shares the node's
// network (its /sys shows the node's NICs), not its PIDs.
func TestChartAccountsPerPart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vals    map[string]any
		dra     bool
		holders []string // the main pod's token holders
	}{
		{"defaults", nil, false, []string{"exporter"}},
		{"exporter auth off", values("exporter.auth.enabled", false), false, nil},
		{"dra", values("dra.enabled", true), true, []string{"exporter"}},
		{"dra, exporter auth off", values("dra.enabled", true, "exporter.auth.enabled", false), true, nil},
		{"dra, exporter and nri off", values("dra.enabled", true, "exporter.enabled", false, "nri.enabled", false), true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, objs := renderObjects(t, tc.vals)
			var r rbac
			for _, o := range objs {
				r.add(o.obj)
			}
			dss := daemonSets(objs)
			want := []string{"rdma-netns"}
			if tc.dra {
				want = append(want, driverAccount)
			}
			if got := slices.Sorted(maps.Keys(dss)); !slices.Equal(got, want) {
				t.Fatalf("DaemonSets %v, want %v", got, want)
			}
			main := dss["rdma-netns"].Spec.Template.Spec
			if main.ServiceAccountName != "rdma-netns" || draContainer(main) != nil {
				t.Errorf("DaemonSet rdma-netns: ServiceAccount %q, driver container %v: want rdma-netns and none", main.ServiceAccountName, draContainer(main) != nil)
			}
			if got := tokenHolders(main); !slices.Equal(got, tc.holders) {
				t.Errorf("DaemonSet rdma-netns: containers holding a token %v, want %v", got, tc.holders)
			}
			if got := accountRules(&r, "kube-system", "rdma-netns"); len(tc.holders) > 0 && !slices.Equal(got, exporterRules) || len(tc.holders) == 0 && len(got) > 0 {
				t.Errorf("ServiceAccount rdma-netns (the exporter's) may %q", got)
			}
			if !tc.dra {
				if got := accountRules(&r, "kube-system", driverAccount); len(got) > 0 {
					t.Errorf("ServiceAccount %s may %q without dra.enabled", driverAccount, got)
				}
				return
			}
			ds := dss[driverAccount]
			spec := ds.Spec.Template.Spec
			if spec.ServiceAccountName != driverAccount || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("DaemonSet %s: ServiceAccount %q, automount %v: want %s and false", ds.Name, spec.ServiceAccountName, spec.AutomountServiceAccountToken, driverAccount)
			}
			var names []string
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				names = append(names, c.Name)
			}
			if !slices.Equal(names, []string{"dra"}) || draContainer(spec) == nil {
				t.Errorf("DaemonSet %s: containers %v, want dra alone, running %s", ds.Name, names, draBinary)
			}
			if got := tokenHolders(spec); !slices.Equal(got, []string{"dra"}) {
				t.Errorf("DaemonSet %s: containers holding a token %v, want dra", ds.Name, got)
			}
			if got := accountRules(&r, "kube-system", driverAccount); !slices.Equal(got, driverRules) {
				t.Errorf("ServiceAccount %s may %q, want %q", driverAccount, got, driverRules)
			}
			if !spec.HostNetwork || spec.HostPID || spec.HostIPC {
				t.Errorf("DaemonSet %s: hostNetwork %v, hostPID %v, hostIPC %v: want the node's network only", ds.Name, spec.HostNetwork, spec.HostPID, spec.HostIPC)
			}
			// Selectors apart: neither DaemonSet may count the other's
			// pods, nor may the exporter's Service select the driver's.
			mainSel, _ := metav1.LabelSelectorAsSelector(dss["rdma-netns"].Spec.Selector)
			draSel, _ := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
			if mainSel.Matches(labels.Set(ds.Spec.Template.Labels)) || draSel.Matches(labels.Set(dss["rdma-netns"].Spec.Template.Labels)) {
				t.Errorf("DaemonSets' selectors overlap: %s selects %v, %s selects %v", mainSel, ds.Spec.Template.Labels, draSel, dss["rdma-netns"].Spec.Template.Labels)
			}
			if err := checkDaemonSet(ds); err != nil {
				t.Errorf("DaemonSet %s: %v", ds.Name, err)
			}
		})
	}
}

// slicePolicyOf is the rendering's ValidatingAdmissionPolicy and binding
// of the driver's slices.
func slicePolicyOf(t *testing.T, objs []object) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	var p *admissionregistrationv1.ValidatingAdmissionPolicy
	var b *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			if p != nil {
				t.Fatalf("ValidatingAdmissionPolicies %s and %s", p.Name, obj.Name)
			}
			p = obj
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			if b != nil {
				t.Fatalf("ValidatingAdmissionPolicyBindings %s and %s", b.Name, obj.Name)
			}
			b = obj
		}
	}
	return p, b
}

// The policy's text, as the API server gets it: it applies to the
// driver's account alone, and denies a write of a ResourceSlice that is
// not the driver's (spec.driver) on the node named by the token (the
// bound token's node claim), before and after the change.
func TestChartDRASlicePolicyText(t *testing.T) {
	_, objs := renderObjects(t, nil)
	if p, b := slicePolicyOf(t, objs); p != nil || b != nil {
		t.Errorf("without dra.enabled: policy %v, binding %v", p, b)
	}
	_, objs = renderObjects(t, values("dra.enabled", true))
	p, b := slicePolicyOf(t, objs)
	if p == nil || b == nil {
		t.Fatalf("with dra.enabled: policy %v, binding %v: want both", p, b)
	}
	if p.Name != slicePolicy || b.Name != slicePolicy || b.Spec.PolicyName != slicePolicy || b.Spec.ParamRef != nil || b.Spec.MatchResources != nil {
		t.Errorf("policy %s, binding %s of %s (paramRef %v, matchResources %v): want %s, bound as it is", p.Name, b.Name, b.Spec.PolicyName, b.Spec.ParamRef, b.Spec.MatchResources, slicePolicy)
	}
	if !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding's validationActions %v, want [Deny]", b.Spec.ValidationActions)
	}
	s := p.Spec
	if s.FailurePolicy == nil || *s.FailurePolicy != admissionregistrationv1.Fail || s.ParamKind != nil || len(s.AuditAnnotations) > 0 {
		t.Errorf("failurePolicy %v, paramKind %v, auditAnnotations %v: want Fail, none, none", s.FailurePolicy, s.ParamKind, s.AuditAnnotations)
	}
	wantRules := []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE", "DELETE"},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"resourceslices"},
		},
	}}}
	if m := s.MatchConstraints; m == nil || fmt.Sprint(m.ResourceRules) != fmt.Sprint(wantRules) || len(m.ExcludeResourceRules) > 0 ||
		m.MatchPolicy != nil && *m.MatchPolicy != admissionregistrationv1.Equivalent {
		t.Errorf("matchConstraints %+v, want %+v (matchPolicy Equivalent: every served version, seen as v1)", m, wantRules)
	}
	wantMatch := []admissionregistrationv1.MatchCondition{{Name: "driver-account", Expression: "request.userInfo.username == '" + driverUser + "'"}}
	if !slices.Equal(s.MatchConditions, wantMatch) {
		t.Errorf("matchConditions %+v, want %+v", s.MatchConditions, wantMatch)
	}
	const key = "'authentication.kubernetes.io/node-name'"
	wantVars := []admissionregistrationv1.Variable{{Name: "nodeName", Expression: "has(request.userInfo.extra) && " + key + " in request.userInfo.extra && " +
		"size(request.userInfo.extra[" + key + "]) == 1 ? request.userInfo.extra[" + key + "][0] : ''"}}
	if !slices.Equal(s.Variables, wantVars) {
		t.Errorf("variables %+v, want %+v", s.Variables, wantVars)
	}
	own := func(o string) string {
		return fmt.Sprintf("%[1]s.spec.driver == '%[2]s' && has(%[1]s.spec.nodeName) && %[1]s.spec.nodeName == variables.nodeName", o, drarecord.DriverName)
	}
	wantExprs := []string{
		"variables.nodeName != ''",
		"request.operation == 'DELETE' || " + own("object"),
		"request.operation == 'CREATE' || " + own("oldObject"),
	}
	var exprs []string
	for _, v := range s.Validations {
		exprs = append(exprs, v.Expression)
		if v.Message == "" || v.Reason == nil || *v.Reason != metav1.StatusReasonForbidden {
			t.Errorf("validation %q: message %q, reason %v: want a message and Forbidden", v.Expression, v.Message, v.Reason)
		}
	}
	if !slices.Equal(exprs, wantExprs) {
		t.Errorf("validations:\n%q\nwant:\n%q", exprs, wantExprs)
	}
}

// evalPolicy runs the policy's matchConditions, variables and validations
// on one request as the API server's ValidatingAdmissionPolicy plugin does
// (its CEL environment for new expressions, so the API server takes the
// policy as written), and returns the denial's message, "" if allowed.
func evalPolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy, op admission.Operation, obj, old *resourcev1.ResourceSlice, u user.Info) string {
	t.Helper()
	env := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
	comp, err := plugincel.NewCompositedCompiler(env)
	if err != nil {
		t.Fatal(err)
	}
	withAuthz := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	var vars []plugincel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		vars = append(vars, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	for _, v := range vars {
		if res := comp.CompileAndStoreVariable(v, withAuthz, environment.NewExpressions); res.Error != nil {
			t.Fatalf("variable %s: %v", v.GetName(), res.Error)
		}
	}
	var conds, validations, messages []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
	}
	for _, v := range p.Spec.Validations {
		validations = append(validations, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		messages = append(messages, &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression})
	}
	for _, e := range append(slices.Clone(conds), validations...) {
		if res := comp.CompileCELExpression(e, withAuthz, environment.NewExpressions); res.Error != nil {
			t.Fatalf("%q: %v", e.GetExpression(), res.Error)
		}
	}
	matcher := matchconditions.NewMatcher(comp.CompileCondition(conds, withAuthz, environment.NewExpressions), p.Spec.FailurePolicy, "policy", "validate", p.Name)
	v := validating.NewValidator(
		comp.CompileCondition(validations, withAuthz, environment.NewExpressions), matcher,
		comp.CompileCondition(nil, withAuthz, environment.NewExpressions),
		comp.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, environment.NewExpressions),
		p.Spec.FailurePolicy, nil)

	gvk := resourcev1.SchemeGroupVersion.WithKind("ResourceSlice")
	gvr := resourcev1.SchemeGroupVersion.WithResource("resourceslices")
	var newObj, oldObj runtime.Object // nil, not a nil *ResourceSlice, when absent
	name := ""
	if obj != nil {
		newObj, name = obj, obj.Name
	}
	if old != nil {
		oldObj, name = old, old.Name
	}
	attrs := admission.NewAttributesRecord(newObj, oldObj, gvk, "", name, gvr, "", op, nil, false, u)
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk,
		VersionedObject: admission.NewLazyObject(newObj), VersionedOldObject: admission.NewLazyObject(oldObj)}
	res := v.Validate(context.Background(), gvr, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
	var denied []string
	for _, d := range res.Decisions {
		if d.Action == validating.ActionDeny {
			denied = append(denied, fmt.Sprintf("%s (%s)", d.Message, d.Evaluation))
		}
	}
	return strings.Join(denied, "; ")
}

// slice is a ResourceSlice of driver on node ("": a slice for all nodes).
func slice(driver, node string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driver + "-x7k2p"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: driver,
			Pool:   resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
		},
	}
	if node == "" {
		s.Spec.AllNodes = ptr.To(true)
	} else {
		s.Spec.NodeName = ptr.To(node)
	}
	return s
}

// tokenOf is the user a bound ServiceAccount token of a pod on node
// authenticates as ("" node: a token without the node claim, as a legacy
// Secret token or a TokenRequest bound to no pod).
func tokenOf(name, node string) user.Info {
	u := &user.DefaultInfo{Name: name, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}}
	if node != "" {
		u.Extra = map[string][]string{
			"authentication.kubernetes.io/pod-name":  {"rdma-netns-dra-abcde"},
			"authentication.kubernetes.io/pod-uid":   {"0b9c7a5e-5d2f-4f5e-9c61-7d1f2e3a4b5c"},
			"authentication.kubernetes.io/node-name": {node},
			"authentication.kubernetes.io/node-uid":  {"5c4b3a2e-1f7d-4c9e-8f5d-2e5d7a9c0b1e"},
		}
	}
	return u
}

// The policy as the API server runs it: the driver's token writes its own
// node's slices of its driver and nothing else; any other user (the
// kubelet, another driver, an administrator) is not its business.
func TestChartDRASlicePolicyDecides(t *testing.T) {
	_, objs := renderObjects(t, values("dra.enabled", true))
	p, _ := slicePolicyOf(t, objs)
	if p == nil {
		t.Fatal("with dra.enabled: no ValidatingAdmissionPolicy")
	}
	const us = drarecord.DriverName
	driver := tokenOf(driverUser, "node-1")
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		obj, old *resourcev1.ResourceSlice
		u        user.Info
		deny     string // in the denial; "" allowed
	}{
		{"create own", admission.Create, slice(us, "node-1"), nil, driver, ""},
		{"update own", admission.Update, slice(us, "node-1"), slice(us, "node-1"), driver, ""},
		{"delete own", admission.Delete, nil, slice(us, "node-1"), driver, ""},
		{"create another node's", admission.Create, slice(us, "node-2"), nil, driver, "not of driver"},
		{"update another node's", admission.Update, slice(us, "node-2"), slice(us, "node-2"), driver, "not of driver"},
		{"move another node's here", admission.Update, slice(us, "node-1"), slice(us, "node-2"), driver, "existing ResourceSlice"},
		{"delete another node's", admission.Delete, nil, slice(us, "node-2"), driver, "existing ResourceSlice"},
		{"create for all nodes", admission.Create, slice(us, ""), nil, driver, "not of driver"},
		{"create another driver's", admission.Create, slice("gpu.nvidia.com", "node-1"), nil, driver, "not of driver"},
		{"delete another driver's", admission.Delete, nil, slice("gpu.nvidia.com", "node-1"), driver, "existing ResourceSlice"},
		{"token without node", admission.Create, slice(us, "node-1"), nil, tokenOf(driverUser, ""), "names no node"},
		{"token with two nodes", admission.Create, slice(us, "node-1"), nil,
			&user.DefaultInfo{Name: driverUser, Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"node-1", "node-2"}}}, "names no node"},
		{"kubelet deletes", admission.Delete, nil, slice(us, "node-1"), &user.DefaultInfo{Name: "system:node:node-2", Groups: []string{"system:nodes"}}, ""},
		{"another driver's account", admission.Create, slice(us, "node-2"), nil, tokenOf("system:serviceaccount:kube-system:gpu-driver", "node-1"), ""},
		{"another release's driver", admission.Create, slice(us, "node-2"), nil, tokenOf("system:serviceaccount:other:rdma-netns-dra", "node-1"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evalPolicy(t, p, tc.op, tc.obj, tc.old, tc.u)
			switch {
			case tc.deny == "" && got != "":
				t.Errorf("denied: %s", got)
			case tc.deny != "" && !strings.Contains(got, tc.deny):
				t.Errorf("decision %q, want a denial saying %q", got, tc.deny)
			}
			if got != "" {
				t.Logf("denied: %s", got)
			}
		})
	}
}
