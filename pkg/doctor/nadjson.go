package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/config"
)

// `rdma-netns doctor nads` reads NetworkAttachmentDefinitions as kubectl
// prints them (-o json) and checks the rdma-netns entries of their chains
// against each other: who picks the NIC, and which device names pods may
// take from other networks' pods. It reads JSON with encoding/json only:
// the doctor is linked into the CNI binary, which links no Kubernetes or
// YAML library.

// maxNADInput bounds what the check reads: a cluster's NADs are a few
// hundred KiB even with thousands of them.
const maxNADInput = 64 << 20

// resourceNameAnnotation is the NAD annotation that makes Multus ask the
// kubelet which device a device plugin allocated to the pod.
const resourceNameAnnotation = "k8s.v1.cni.cncf.io/resourceName"

// NADView is one NetworkAttachmentDefinition whose chain has rdma-netns.
type NADView struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Chain is the plugin types in order, as the NAD's spec.config lists them.
	Chain []ChainPlugin `json:"chain"`
	// ResourceName is the NAD's device plugin resource, if annotated.
	ResourceName string `json:"resourceName,omitempty"`
	// RdmaNetns are the settings of its rdma-netns entry (the first, where
	// a chain has more than one).
	RdmaDevName          string   `json:"rdmaDevName,omitempty"`
	PodRdmaDevNamePrefix string   `json:"podRdmaDevNamePrefix,omitempty"`
	AllowedPodDevices    []string `json:"allowedPodDevices,omitempty"`
}

// ChainPlugin is one plugin of a NAD's chain.
type ChainPlugin struct {
	Type string `json:"type"`
	// DeviceID is true where the plugin declares the deviceID capability:
	// Multus then passes it the pod's network-selection deviceID (or the
	// device plugin's allocation).
	DeviceID bool `json:"deviceIDCapability,omitempty"`
}

// nadRef names a NAD the way kubectl does: namespace/name.
type nadRef struct{ Namespace, Name string }

func (n nadRef) String() string {
	if n.Namespace == "" {
		return n.Name
	}
	return n.Namespace + "/" + n.Name
}

// parsedNAD is one NAD read from the input, its chain parsed.
type parsedNAD struct {
	ref          nadRef
	resourceName string
	chain        []ChainPlugin
	// rdma are the indexes in chain of rdma-netns entries, and confs
	// their configurations as the plugin reads them.
	rdma  []int
	confs []*config.NetConf
}

// nadObject is what the check reads of a NAD (or of a List holding NADs).
type nadObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Namespace   string            `json:"namespace"`
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec *struct {
		Config json.RawMessage `json:"config"`
	} `json:"spec"`
	Items *[]json.RawMessage `json:"items"`
}

// readNADObjects decodes kubectl's output: a List with items, or one NAD.
func readNADObjects(in io.Reader) ([]json.RawMessage, error) {
	data, err := io.ReadAll(io.LimitReader(in, maxNADInput+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the input: %v", err)
	}
	if len(data) > maxNADInput {
		return nil, fmt.Errorf("the input is more than %d bytes", maxNADInput)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errors.New("the input is empty (did kubectl fail?)")
	}
	if data[0] != '{' {
		return nil, errors.New("the input is not a JSON object (YAML or a table?): pass kubectl -o json")
	}
	var top nadObject
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("the input is not valid JSON: %v", err)
	}
	switch {
	case top.Items != nil:
		return *top.Items, nil
	case top.Kind == "NetworkAttachmentDefinition" || top.Spec != nil:
		return []json.RawMessage{data}, nil
	}
	return nil, fmt.Errorf("the input is neither a List of NetworkAttachmentDefinitions nor one (kind %q, no items, no spec)", top.Kind)
}

// parseNAD reads one item. ok false means the item is not a NAD (another
// kind in a mixed List) and is skipped.
func parseNAD(raw json.RawMessage) (n *parsedNAD, ok bool, err error) {
	var obj nadObject
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, true, fmt.Errorf("is not a Kubernetes object: %v", err)
	}
	if obj.Kind != "" && obj.Kind != "NetworkAttachmentDefinition" {
		return nil, false, nil
	}
	n = &parsedNAD{
		ref:          nadRef{obj.Metadata.Namespace, obj.Metadata.Name},
		resourceName: obj.Metadata.Annotations[resourceNameAnnotation],
	}
	if obj.Spec == nil || len(obj.Spec.Config) == 0 || string(obj.Spec.Config) == "null" {
		return n, true, nil
	}
	var conf string
	if err := json.Unmarshal(obj.Spec.Config, &conf); err != nil {
		return n, true, errors.New("spec.config is not a string (it holds the CNI configuration as JSON text)")
	}
	if strings.TrimSpace(conf) == "" {
		return n, true, nil
	}
	return n, true, n.parseChain([]byte(conf))
}

// netConf is the part of a CNI configuration, single or list, that tells
// which it is. As Multus does, a configuration without a type is a list.
type netConf struct {
	CNIVersion string            `json:"cniVersion"`
	Name       string            `json:"name"`
	Type       string            `json:"type"`
	Plugins    []json.RawMessage `json:"plugins"`
}

// parseChain fills the NAD's chain from its spec.config.
func (n *parsedNAD) parseChain(conf []byte) error {
	var nc netConf
	if err := json.Unmarshal(conf, &nc); err != nil {
		return fmt.Errorf("spec.config is not valid JSON: %v", err)
	}
	entries := []json.RawMessage{conf}
	if nc.Type == "" {
		if len(nc.Plugins) == 0 {
			return errors.New(`spec.config has neither "type" nor "plugins"`)
		}
		entries = nc.Plugins
	}
	for i, raw := range entries {
		if err := n.addPlugin(i, raw, nc); err != nil {
			return err
		}
	}
	return nil
}

// addPlugin appends one entry of the chain; an rdma-netns entry is read
// as the plugin reads it, with the list's cniVersion and name, which the
// runtime puts into every entry.
func (n *parsedNAD) addPlugin(i int, raw json.RawMessage, list netConf) error {
	var p struct {
		Type         string          `json:"type"`
		Capabilities map[string]bool `json:"capabilities"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("plugin %d of spec.config is not a JSON object: %v", i, err)
	}
	n.chain = append(n.chain, ChainPlugin{Type: p.Type, DeviceID: p.Capabilities["deviceID"]})
	if p.Type != "rdma-netns" {
		return nil
	}
	if list.Type == "" {
		var err error
		if raw, err = withListKeys(raw, list); err != nil {
			return fmt.Errorf("plugin %d (rdma-netns) of spec.config: %v", i, err)
		}
	}
	c, err := config.ParseSettings(raw, "")
	if err != nil {
		return &rdmaConfError{err}
	}
	n.rdma = append(n.rdma, len(n.chain)-1)
	n.confs = append(n.confs, c)
	return nil
}

// rdmaConfError is an rdma-netns entry the plugin itself refuses: every
// ADD on that network fails.
type rdmaConfError struct{ err error }

func (e *rdmaConfError) Error() string { return e.err.Error() }

// withListKeys sets cniVersion and name of the list in one of its entries.
func withListKeys(raw json.RawMessage, list netConf) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	for k, v := range map[string]string{"cniVersion": list.CNIVersion, "name": list.Name} {
		if v == "" {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m[k] = b
	}
	return json.Marshal(m)
}

// view is the NAD as the report shows it.
func (n *parsedNAD) view() NADView {
	c := n.confs[0]
	return NADView{
		Namespace: n.ref.Namespace, Name: n.ref.Name, Chain: n.chain, ResourceName: n.resourceName,
		RdmaDevName: c.RdmaDevName, PodRdmaDevNamePrefix: c.PodRdmaDevNamePrefix, AllowedPodDevices: c.AllowedPodDevices,
	}
}
