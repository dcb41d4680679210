package conf

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
)

// netdevSelector is a CEL selector on the driver's netdev attribute, as
// the rails template writes it; the group is the NIC's name.
var netdevSelector = regexp.MustCompile(`^device\.attributes\["nic\.rdma-netns\.io"\]\.netdev == "([^"\\]+)"$`)

// hasNetdevSelector: some request of tpl picks its NIC by name, which
// makes tpl a rails template (railSelectors).
func hasNetdevSelector(tpl *resourcev1.ResourceClaimTemplate) bool {
	for _, r := range tpl.Spec.Spec.Devices.Requests {
		if r.Exactly != nil && slices.ContainsFunc(r.Exactly.Selectors, func(s resourcev1.DeviceSelector) bool {
			return s.CEL != nil && netdevSelector.MatchString(s.CEL.Expression)
		}) {
			return true
		}
	}
	return false
}

// railSelectors are the NICs of a rails template by request: every NIC
// request selects exactly one NIC by its netdev, and no two the same. A
// request without one gets any NIC, and rail k's network may get another
// rail's NIC; two on one NIC leave the claim unallocatable.
func railSelectors(tpl *resourcev1.ResourceClaimTemplate) (map[string]string, error) {
	nics := map[string]string{}
	byNIC := map[string]string{}
	for _, r := range tpl.Spec.Spec.Devices.Requests {
		if r.Exactly == nil || r.Exactly.DeviceClassName != draDeviceClass {
			continue
		}
		if n := exactCount(r.Exactly); n != 1 {
			return nil, fmt.Errorf("request %s asks for %d NICs (0: All), want one, its rail's NIC", r.Name, n)
		}
		var names []string
		for _, s := range r.Exactly.Selectors {
			if s.CEL == nil {
				continue
			}
			m := netdevSelector.FindStringSubmatch(s.CEL.Expression)
			if m == nil {
				return nil, fmt.Errorf("request %s: selector %q is not a netdev selector (device.attributes[%q].netdev == \"<NIC>\")", r.Name, s.CEL.Expression, "nic.rdma-netns.io")
			}
			names = append(names, m[1])
		}
		if len(names) != 1 {
			return nil, fmt.Errorf("request %s has %d netdev selectors, want 1: its rail's NIC", r.Name, len(names))
		}
		if other, ok := byNIC[names[0]]; ok {
			return nil, fmt.Errorf("requests %s and %s both select %s: the claim is never allocated", other, r.Name, names[0])
		}
		byNIC[names[0]] = r.Name
		nics[r.Name] = names[0]
	}
	return nics, nil
}

// checkRailNADs: each NAD takes a request of tpl, and no two the same.
func checkRailNADs(tpl *resourcev1.ResourceClaimTemplate, nads []*networkAttachmentDefinition) error {
	nics, err := railSelectors(tpl)
	if err != nil {
		return err
	}
	taken := map[string]string{}
	for _, nad := range nads {
		dra := draOf(nad)
		if dra == nil || dra.Request == nil {
			return fmt.Errorf("NAD %s names no request", nad.Name)
		}
		req := *dra.Request
		if _, ok := nics[req]; !ok {
			return fmt.Errorf("NAD %s takes request %q, which template %s does not make with a rail's NIC (%v)", nad.Name, req, tpl.Name, nics)
		}
		if other, ok := taken[req]; ok {
			return fmt.Errorf("NADs %s and %s both take request %s", other, nad.Name, req)
		}
		taken[req] = nad.Name
	}
	return nil
}

func railsTemplate(t *testing.T) *resourcev1.ResourceClaimTemplate {
	t.Helper()
	return templateIn(t, "dra-claimtemplate-rails.yaml")
}

func draRailNADs(t *testing.T) []*networkAttachmentDefinition {
	t.Helper()
	var nads []*networkAttachmentDefinition
	for _, o := range mustDecodeFile(t, "nad-dra-rails.yaml") {
		nads = append(nads, o.obj.(*networkAttachmentDefinition))
	}
	return nads
}

// The rails template gives nic<k> rail k's NIC by name, the one
// nad-dra-rails.yaml's rdma-dra-rail<k> attaches; the check refuses each
// way of losing that.
func TestDRARailsTemplate(t *testing.T) {
	base := railsTemplate(t)
	if base.Name != "rdma-rails-4" {
		t.Errorf("template %s, the docs name rdma-rails-4", base.Name)
	}
	nics, err := railSelectors(base)
	if err != nil {
		t.Fatal(err)
	}
	// nad-rails.yaml's rails 0 and 1, and the next two.
	want := map[string]string{"nic0": "ens1f0np0", "nic1": "ens2f0np0", "nic2": "ens3f0np0", "nic3": "ens4f0np0"}
	if fmt.Sprint(nics) != fmt.Sprint(want) {
		t.Errorf("NICs by request %v, want %v", nics, want)
	}
	nads := draRailNADs(t)
	if len(nads) != len(nics) {
		t.Errorf("nad-dra-rails.yaml has %d networks, the template %d NICs", len(nads), len(nics))
	}
	for k, nad := range nads {
		if got, want := *draOf(nad).Request, "nic"+strconv.Itoa(k); got != want {
			t.Errorf("%s takes request %s, want %s", nad.Name, got, want)
		}
	}
	expr := func(nic string) string {
		return `device.attributes["nic.rdma-netns.io"].netdev == "` + nic + `"`
	}
	for _, tc := range []struct {
		name   string
		change func(*resourcev1.DeviceClaim)
		nads   func([]*networkAttachmentDefinition)
		want   string
	}{
		{"valid baseline", func(*resourcev1.DeviceClaim) {}, nil, ""},
		{"a request without its selector", func(d *resourcev1.DeviceClaim) { d.Requests[2].Exactly.Selectors = nil }, nil, "request nic2 has 0 netdev selectors"},
		{"a request with two", func(d *resourcev1.DeviceClaim) {
			d.Requests[1].Exactly.Selectors = append(d.Requests[1].Exactly.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: expr("ens5f0np0")}})
		}, nil, "request nic1 has 2 netdev selectors"},
		{"two requests on one NIC", func(d *resourcev1.DeviceClaim) { d.Requests[3].Exactly.Selectors[0].CEL.Expression = expr("ens1f0np0") }, nil,
			"requests nic0 and nic3 both select ens1f0np0"},
		{"a selector on another attribute", func(d *resourcev1.DeviceClaim) {
			d.Requests[0].Exactly.Selectors[0].CEL.Expression = `device.attributes["resource.kubernetes.io"].pciBusID == "0000:3b:00.0"`
		}, nil, "request nic0: selector"},
		{"a request of two NICs", func(d *resourcev1.DeviceClaim) {
			d.Requests[0].Exactly.AllocationMode = resourcev1.DeviceAllocationModeExactCount
			d.Requests[0].Exactly.Count = 2
		}, nil, "request nic0 asks for 2 NICs"},
		{"a request renamed", func(d *resourcev1.DeviceClaim) { d.Requests[1].Name = "rail1" }, nil, `NAD rdma-dra-rail1 takes request "nic1"`},
		{"a NAD on a request the template lacks", func(*resourcev1.DeviceClaim) {}, func(n []*networkAttachmentDefinition) {
			n[3].Spec.Config = replaceOnce(t, n[3].Spec.Config, `"request": "nic3"`, `"request": "nic4"`)
		}, `NAD rdma-dra-rail3 takes request "nic4"`},
		{"two NADs on one request", func(*resourcev1.DeviceClaim) {}, func(n []*networkAttachmentDefinition) {
			n[2].Spec.Config = replaceOnce(t, n[2].Spec.Config, `"request": "nic2"`, `"request": "nic1"`)
		}, "NADs rdma-dra-rail1 and rdma-dra-rail2 both take request nic1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl := base.DeepCopy()
			tc.change(&tpl.Spec.Spec.Devices)
			nads := draRailNADs(t)
			if tc.nads != nil {
				tc.nads(nads)
			}
			wantRejection(t, "valid template", checkRailNADs(tpl, nads), tc.want)
		})
	}
}

// replaceOnce is strings.Replace(s, old, new, 1) that fails t when s has
// no old: a case that changed nothing would pass for the wrong reason.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("no %s in %s", old, s)
	}
	return strings.Replace(s, old, new, 1)
}

// The rails template as TestTwoNodes applies it (overlays/
// dra-claimtemplate-rails) gives nic<k> the VMs' eth<k+1>, every request
// its own NIC.
func TestDRARailsOverlay(t *testing.T) {
	got, err := renderOverlay(filepath.Join(overlaysDir, "dra-claimtemplate-rails"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("the overlay renders %d objects, want the template", len(got))
	}
	data, err := json.Marshal(got[0].obj)
	if err != nil {
		t.Fatal(err)
	}
	var tpl resourcev1.ResourceClaimTemplate
	if err := json.Unmarshal(data, &tpl); err != nil {
		t.Fatal(err)
	}
	nics, err := railSelectors(&tpl)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"nic0": "eth1", "nic1": "eth2", "nic2": "eth3", "nic3": "eth4"}
	if fmt.Sprint(nics) != fmt.Sprint(want) {
		t.Errorf("NICs by request %v, want %v", nics, want)
	}
}
