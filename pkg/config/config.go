// Package config parses and validates the rdma-netns network configuration.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
)

// SupportedVersions are the CNI versions rdma-netns speaks. Versions before
// 0.3.0 have no prevResult, and a meta-plugin cannot work without one.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

const (
	// DefaultStateDir holds one record per attachment.
	DefaultStateDir = "/var/lib/cni/rdma-netns"
	// MaxConfigSize bounds the configuration ADD accepts. A network's
	// config is a few KiB, but Multus copies a pod's cni-args into it: the
	// API server lets a pod's annotations hold 256 KiB, and encoding/json,
	// which Multus re-encodes them with, writes '<', '>', '&', control
	// characters and invalid bytes as six bytes each (1.5 MiB), beside a
	// NetworkAttachmentDefinition's own config (etcd takes 1.5 MiB objects).
	// The other verbs take any size: they must not fail on what a pod
	// wrote, and skel has read the bytes already.
	MaxConfigSize = 4 << 20
)

// QoS is the RoCE type of service and traffic class applied to the device
// once it is in the pod.
type QoS struct {
	ToS *int `json:"tos,omitempty"`
	TC  *int `json:"tc,omitempty"`
}

// Problems is what is wrong with q, each error starting with the key
// below rdmaQoS it is about (" is set ...", ".tos ...").
func (q *QoS) Problems() []error {
	var errs []error
	if q.ToS == nil && q.TC == nil {
		errs = append(errs, errors.New(" is set but names neither tos nor tc"))
	}
	if q.ToS != nil && (*q.ToS < 0 || *q.ToS > 255) {
		errs = append(errs, fmt.Errorf(".tos %d is out of range 0-255", *q.ToS))
	}
	if q.TC != nil && (*q.TC < 0 || *q.TC > 255) {
		errs = append(errs, fmt.Errorf(".tc %d is out of range 0-255", *q.TC))
	}
	return errs
}

// NetConf is the plugin's entry in a conflist.
//
// It names the keys of types.PluginConf it uses instead of embedding
// that type: a fresh process decoding into it paid, in the test VM, for
// walking fields it never reads (IPAM, DNS, capabilities, a generic map
// for prevResult) on every ADD and DEL.
type NetConf struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Name       string `json:"name,omitempty"`
	Type       string `json:"type,omitempty"`
	// Capabilities are the runtime capabilities this plugin asks for
	// (deviceID); the runtime then fills RuntimeConfig.
	Capabilities map[string]bool `json:"capabilities,omitempty"`
	// ValidAttachments are the attachments a GC must keep.
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`

	// RdmaDevice names the RDMA device to move, bypassing discovery.
	RdmaDevice string `json:"rdmaDevice,omitempty"`
	// DeviceID and PCIBusID are set by Multus / SR-IOV style configs: a PCI
	// address or an auxiliary device name.
	DeviceID string `json:"deviceID,omitempty"`
	PCIBusID string `json:"pciBusID,omitempty"`
	// AllowSharedMode lets ADD pass the result through unchanged (with a
	// warning) when the RDMA subsystem is in shared mode.
	AllowSharedMode bool `json:"allowSharedMode,omitempty"`
	// RdmaDevName renames the device inside the pod.
	RdmaDevName string `json:"rdmaDevName,omitempty"`
	RdmaQoS     *QoS   `json:"rdmaQoS,omitempty"`
	// AllowedPodDevices are the RDMA devices a pod may pick for itself
	// (rdmaDevice per pod, or a deviceID in its network-selection
	// element). Without the list a pod's pick must name the device the
	// network gives it anyway: the pod author is not the network's.
	AllowedPodDevices []string `json:"allowedPodDevices,omitempty"`
	// PodRdmaDevNamePrefix lets a pod name its device inside the pod
	// (rdmaDevName per pod), with a name that starts with this prefix.
	PodRdmaDevNamePrefix string `json:"podRdmaDevNamePrefix,omitempty"`

	// DRA, when set, has the plugin attach the NIC the pod's
	// ResourceClaim holds: it comes first in the chain and hands the NIC
	// to host-device itself (package drarecord says how it learns which).
	DRA *DRA `json:"dra,omitempty"`
	// IPAM is passed as it is to host-device in dra mode.
	IPAM json.RawMessage `json:"ipam,omitempty"`
	// Claims, when set, makes this entry of the node's primary network
	// attach, after the primary plugin, every NIC of the pod's claims
	// whose configuration asks for it (a claim alone: no NAD, no Multus).
	// Each NIC's names and addresses come from its claim, so the entry
	// takes nothing that picks or names a device.
	Claims bool `json:"claims,omitempty"`

	// StateDir is never used: the records are written in the node's
	// directory (DefaultStateDir). A network that names another is
	// refused at ADD (ForeignStateDir).
	StateDir string `json:"stateDir,omitempty"`
	LogFile  string `json:"logFile,omitempty"`
	LogLevel string `json:"logLevel,omitempty"`

	RuntimeConfig struct {
		DeviceID          string `json:"deviceID,omitempty"`
		CNIDeviceInfoFile string `json:"CNIDeviceInfoFile,omitempty"`
		// IPs are the pod's addresses for this attachment (the "ips"
		// capability), which dra mode passes on to host-device's IPAM as
		// they are: read by no one else, so that DEL never fails on them.
		IPs json.RawMessage `json:"ips,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	// ArgsJSON is args as the runtime sent it. Multus copies a pod's
	// cni-args into args.cni as they are, of any JSON type: only ADD reads
	// them (PodRequest), so that DEL never fails on what a pod wrote.
	ArgsJSON json.RawMessage `json:"args,omitempty"`

	// PrevResultJSON is prevResult as the runtime sent it: types.PluginConf
	// holds it as a generic map, which costs a decode into interfaces and
	// an encode back before the result can be read (~0.5 ms of an ADD in
	// the test VM); DEL never reads it.
	PrevResultJSON json.RawMessage `json:"prevResult,omitempty"`
	// Result is prevResult converted to the current result type; nil when
	// the runtime sent none.
	Result *current.Result `json:"-"`
	// CNIArgs are the rdma-netns keys found in CNI_ARGS.
	CNIArgs PerPodArgs `json:"-"`
	// Pod is the Kubernetes pod the runtime named in CNI_ARGS, if any.
	Pod PodRef `json:"-"`
	// cniArgsErr says why CNI_ARGS could not be read; only ADD fails on it.
	cniArgsErr error

	// prevVersion is the cniVersion prevResult carried.
	prevVersion string
	// pciBusIDFrom names where PCIBusID came from when the network's
	// configuration did not set it (PinDRA).
	pciBusIDFrom string
}

// DRA is the network's "dra" object.
type DRA struct {
	// Request is the pod's request (or request/subrequest) whose NIC this
	// network attaches; "" means all the pod's NICs of the driver, in order.
	Request string `json:"request,omitempty"`
	// Index picks among the request's NICs, from 0; nil leaves it to the
	// pod (draIndex), else 0.
	Index *int `json:"index,omitempty"`
	// RecordDir is never read: the records are read from the node's
	// directory alone (drarecord.DefaultDir), since a NAD that chose it
	// could name any NIC of the node in a record of its own. ADD refuses
	// a value other than that directory; any value parses, so DEL and
	// CHECK run whatever a NAD says.
	RecordDir string `json:"recordDir,omitempty"`
}

// ForeignRecordDir reports whether the network's recordDir names a
// directory other than the node's, drarecord.DefaultDir (however spelled):
// ADD refuses such a network.
func (d *DRA) ForeignRecordDir() bool {
	return d != nil && d.RecordDir != "" && filepath.Clean(d.RecordDir) != drarecord.DefaultDir
}

// ForeignStateDir reports whether the network's stateDir names a
// directory other than the node's (DefaultStateDir): the plugin writes its
// records only there, and ADD refuses the network.
func (c *NetConf) ForeignStateDir() bool {
	return c.StateDir != "" && filepath.Clean(c.StateDir) != DefaultStateDir
}

// ForeignLogFile reports whether the network's logFile names a file
// outside the node's log directory (logging.Dir): the plugin never opens
// it, and ADD refuses the network.
func (c *NetConf) ForeignLogFile() bool {
	return c.LogFile != "" && !logging.Allowed(c.LogFile)
}

// maxDRAIndex bounds dra.index and a pod's draIndex: a pod holds at most a
// few claims of at most 32 results each.
const maxDRAIndex = 1023

// PodRef is the pod a runtime names in CNI_ARGS (K8S_POD_NAMESPACE,
// K8S_POD_NAME): recorded so metrics and reports can say which pod holds
// a device.
type PodRef struct {
	Namespace, Name string
	// UID is K8S_POD_UID as the runtime passed it, unchecked: dra mode
	// checks it (drarecord.CheckPodUID) before it looks for records.
	UID string `json:"-"`
}

// PerPodArgs are the settings a pod may pass through CNI_ARGS or args.cni.
// They are untrusted: see PodRequest.
type PerPodArgs struct {
	RdmaDevice  string `json:"rdmaDevice,omitempty"`
	RdmaDevName string `json:"rdmaDevName,omitempty"`
}

// ValidRDMAName accepts the names the kernel and udev give RDMA devices
// (mlx5_0, irdma1, rocep47s0f0, rxe_eth1). The kernel limit is 63 bytes.
func ValidRDMAName(s string) bool { return nameLike(s, 63) }

// validDeviceID accepts PCI addresses and auxiliary device names.
func validDeviceID(s string) bool { return nameLike(s, 128) }

// nameLike reports whether s is 1 to max letters, digits, '_', '.', ':' or
// '-', starting with a letter or digit. Written out rather than as a
// regexp: a package-level regexp with a bounded repetition is compiled at
// every start of the binary, and that start is paid on every CNI call.
func nameLike(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		case i > 0 && (b == '_' || b == '.' || b == ':' || b == '-'):
		default:
			return false
		}
	}
	return true
}

var logLevels = map[string]bool{"": true, "error": true, "warn": true, "warning": true, "info": true, "debug": true}

// Parse decodes and validates stdin and CNI_ARGS, and converts prevResult
// into Result. It does not require a prevResult: ADD asks for one.
func Parse(stdin []byte, cniArgs string) (*NetConf, error) {
	conf, err := ParseSettings(stdin, cniArgs)
	if err != nil || conf.PrevResultJSON == nil || string(conf.PrevResultJSON) == "null" {
		return conf, err
	}
	if t := bytes.TrimSpace(conf.PrevResultJSON); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("could not parse prevResult: it is not a JSON object; the plugin before rdma-netns in the chain must pass on a CNI result")
	}
	var prev struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(conf.PrevResultJSON, &prev); err != nil {
		return nil, fmt.Errorf("could not parse prevResult: %v", err)
	}
	raw := []byte(conf.PrevResultJSON)
	if prev.CNIVersion == "" {
		// Results before 1.0.0 may omit their version; the spec has it
		// match the configuration's.
		if raw, err = withVersion(raw, conf.CNIVersion); err != nil {
			return nil, fmt.Errorf("could not parse prevResult: %v", err)
		}
	}
	// As the CNI library's version.ParsePrevResult reads it: in the
	// configuration's version, whatever the result says.
	parsed, err := create.Create(conf.CNIVersion, raw)
	if err != nil {
		return nil, fmt.Errorf("could not parse prevResult: %v", err)
	}
	res, err := current.NewResultFromResult(parsed)
	if err != nil {
		return nil, fmt.Errorf("could not convert prevResult to version %s: %v", current.ImplementedSpecVersion, err)
	}
	conf.Result = res
	conf.prevVersion = prev.CNIVersion
	return conf, nil
}

// withVersion sets cniVersion in a result that has none.
func withVersion(raw []byte, v string) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	m["cniVersion"] = v
	return json.Marshal(m)
}

// PrintResult writes prevResult on, in the configuration's version: as the
// runtime sent it when it already is in that version (it parsed as a valid
// result of that version, in Parse), converted otherwise.
func (c *NetConf) PrintResult(w io.Writer) error {
	if c.prevVersion == c.CNIVersion && len(c.PrevResultJSON) > 0 {
		if _, err := w.Write(append(bytes.TrimSpace(c.PrevResultJSON), '\n')); err != nil {
			return fmt.Errorf("cannot write the result: %v", err)
		}
		return nil
	}
	res, err := c.Result.GetAsVersion(c.CNIVersion)
	if err != nil {
		return fmt.Errorf("cannot convert the result to version %s: %v", c.CNIVersion, err)
	}
	return res.PrintTo(w)
}

// ParseSettings is Parse without the prevResult conversion, for the verbs
// that never read it (DEL, GC, STATUS): decoding a result once more is a
// measurable share of a DEL, and a DEL must not fail over a field it does
// not use. Result stays nil.
func ParseSettings(stdin []byte, cniArgs string) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("failed to parse network configuration: %v", err)
	}
	// CNI_ARGS carries what the pod asked for: a malformed entry fails
	// ADD (PodRequest) and nothing else.
	conf.CNIArgs, conf.Pod, conf.cniArgsErr = parseCNIArgs(cniArgs)
	if err := conf.validate(); err != nil {
		return nil, err
	}
	return conf, nil
}

// CheckSize refuses, for ADD, a configuration of size bytes over
// MaxConfigSize, saying how much of it the pod's cni-args are.
func (c *NetConf) CheckSize(size int) error {
	if size <= MaxConfigSize {
		return nil
	}
	return fmt.Errorf("network configuration is %d bytes, more than the %d this plugin accepts; the pod's cni-args (args) are %d bytes of it; nothing was changed", size, MaxConfigSize, len(c.ArgsJSON))
}

func (c *NetConf) validate() error {
	if c.CNIVersion != "" && !supported(c.CNIVersion) {
		return fmt.Errorf("cniVersion %q is not supported: use one of %s (versions before 0.3.0 carry no prevResult)", c.CNIVersion, strings.Join(SupportedVersions, ", "))
	}
	var errs []error
	names := []struct{ field, val string }{
		{"rdmaDevice", c.RdmaDevice},
		{"rdmaDevName", c.RdmaDevName},
	}
	for i, d := range c.AllowedPodDevices {
		names = append(names, struct{ field, val string }{fmt.Sprintf("allowedPodDevices[%d]", i), d})
	}
	for _, f := range names {
		if f.val != "" && !ValidRDMAName(f.val) {
			errs = append(errs, errBadName(f.field, f.val))
		}
	}
	if p := c.PodRdmaDevNamePrefix; p != "" && !ValidRDMAName(p) {
		errs = append(errs, errBadName("podRdmaDevNamePrefix", p))
	}
	for _, f := range []struct{ field, val string }{
		{"deviceID", c.DeviceID},
		{"pciBusID", c.PCIBusID},
	} {
		if f.val != "" && !validDeviceID(f.val) {
			errs = append(errs, errBadDeviceID(f.field, f.val))
		}
	}
	for _, f := range []struct{ field, val string }{
		{"stateDir", c.StateDir},
		{"logFile", c.LogFile},
		{"runtimeConfig.CNIDeviceInfoFile", c.RuntimeConfig.CNIDeviceInfoFile},
	} {
		if f.val != "" && (!filepath.IsAbs(f.val) || strings.ContainsRune(f.val, 0)) {
			errs = append(errs, fmt.Errorf("%s %q must be an absolute path", f.field, f.val))
		}
	}
	if d := c.DRA; d != nil {
		if d.Request != "" && !validRequest(d.Request) {
			errs = append(errs, errBadRequest("dra.request", d.Request))
		}
		if d.Index != nil && (*d.Index < 0 || *d.Index > maxDRAIndex) {
			errs = append(errs, fmt.Errorf("dra.index %d is out of range 0-%d", *d.Index, maxDRAIndex))
		}
	}
	if c.Claims {
		if set := c.deviceSettings(); len(set) > 0 {
			errs = append(errs, fmt.Errorf("\"claims\" takes each NIC and its names from the pod's claims, so it cannot be combined with %s; remove them", strings.Join(set, ", ")))
		}
	}
	if !logLevels[strings.ToLower(c.LogLevel)] {
		errs = append(errs, fmt.Errorf("logLevel %q is not one of error, warn, info, debug", c.LogLevel))
	}
	if q := c.RdmaQoS; q != nil {
		for _, err := range q.Problems() {
			errs = append(errs, fmt.Errorf("rdmaQoS%v", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid rdma-netns configuration: %w", errors.Join(errs...))
	}
	return nil
}

// deviceSettings are the keys set that pick a device, name it in the
// pod or give it addresses: what a "claims" entry leaves to the claims.
func (c *NetConf) deviceSettings() []string {
	var set []string
	for _, f := range []struct {
		key string
		on  bool
	}{
		{"dra", c.DRA != nil}, {"rdmaDevice", c.RdmaDevice != ""}, {"deviceID", c.DeviceID != ""},
		{"pciBusID", c.PCIBusID != ""}, {"rdmaDevName", c.RdmaDevName != ""}, {"rdmaQoS", c.RdmaQoS != nil},
		{"allowedPodDevices", len(c.AllowedPodDevices) > 0}, {"podRdmaDevNamePrefix", c.PodRdmaDevNamePrefix != ""},
		{"ipam", len(c.IPAM) > 0},
	} {
		if f.on {
			set = append(set, f.key)
		}
	}
	return set
}

func errBadName(field, val string) error {
	return fmt.Errorf("%s %s is not a valid RDMA device name (letters, digits, '_', '.', ':', '-', at most 63 characters)", field, Quote(val))
}

func errBadDeviceID(field, val string) error {
	return fmt.Errorf("%s %s is not a PCI address or auxiliary device name", field, Quote(val))
}

// maxQuoted bounds what an error or a log line quotes of a value: a pod's
// value may be as large as its annotations, and the error becomes a pod
// event and a log line on every retry of the kubelet. It is above the
// longest valid device ID (128), so a value a few bytes too long is still
// shown whole.
const maxQuoted = 160

// Quote is s in Go's quoted form, cut after maxQuoted bytes with its
// length said.
func Quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:maxQuoted]), len(s))
}

// Source says where a setting came from, for the log and for errors.
type Source struct {
	Value string
	From  string
}

// NetworkDevice is the RDMA device the network's configuration names, if
// any.
func (c *NetConf) NetworkDevice() Source {
	return first(Source{c.RdmaDevice, "rdmaDevice"})
}

// NetworkDeviceID is the device ID the network's configuration holds: the
// operator's, or a device plugin's allocation, which Multus writes into
// every plugin's deviceID and pciBusID (and into runtimeConfig.deviceID
// too, where it then names the source in the log).
func (c *NetConf) NetworkDeviceID() Source {
	if c.pciBusIDFrom != "" {
		return Source{c.PCIBusID, c.pciBusIDFrom}
	}
	rc := c.RuntimeConfig.DeviceID
	if rc != "" && (rc == c.DeviceID || rc == c.PCIBusID) {
		return Source{rc, "runtimeConfig.deviceID"}
	}
	return first(
		Source{c.DeviceID, "deviceID"},
		Source{c.PCIBusID, "pciBusID"},
	)
}

// PinDRA has the rest of ADD treat the NIC at PCI address pci as the
// network's own, exactly as if its configuration set pciBusID; from says
// where the address came from, for the log and for errors.
func (c *NetConf) PinDRA(pci, from string) {
	c.PCIBusID = pci
	c.pciBusIDFrom = from
}

// SetPrevResult makes r the result ADD builds on and passes on, as if the
// runtime had sent it as prevResult: in dra mode it comes from the
// plugin's own call of host-device.
func (c *NetConf) SetPrevResult(r types.Result) error {
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return fmt.Errorf("cannot convert host-device's result to version %s: %v", current.ImplementedSpecVersion, err)
	}
	c.Result = res
	c.PrevResultJSON = nil
	c.prevVersion = ""
	return nil
}

// PodRequest is what the pod asked for itself: an RDMA device by name
// (rdmaDevice in CNI_ARGS or args.cni), by device ID (a runtimeConfig.deviceID
// that the network's configuration does not hold: Multus passes a pod's
// network-selection deviceID there when no device plugin allocated one),
// and a name for it inside the pod (rdmaDevName). None of it is trusted:
// the plugin honours it only where the network allows.
type PodRequest struct {
	Devices   []Source
	DeviceIDs []Source
	DevName   Source
}

// Empty reports whether the pod asked for nothing.
func (r PodRequest) Empty() bool {
	return len(r.Devices) == 0 && len(r.DeviceIDs) == 0 && r.DevName.Value == ""
}

// PodRequest reads and checks the per-pod settings. Only ADD calls it: the
// other verbs act on what the records say was done, and never fail on what
// a pod wrote.
func (c *NetConf) PodRequest() (PodRequest, error) {
	var req PodRequest
	var errs []error
	if c.cniArgsErr != nil {
		errs = append(errs, c.cniArgsErr)
	}
	argsCNI, err := c.argsCNI()
	if err != nil {
		errs = append(errs, err)
	}
	req.Devices = validNames(&errs, Source{c.CNIArgs.RdmaDevice, "CNI_ARGS rdmaDevice"}, Source{argsCNI.RdmaDevice, "args.cni.rdmaDevice"})
	if rc := c.RuntimeConfig.DeviceID; rc != "" && rc != c.DeviceID && rc != c.PCIBusID {
		if validDeviceID(rc) {
			req.DeviceIDs = append(req.DeviceIDs, Source{rc, "runtimeConfig.deviceID"})
		} else {
			errs = append(errs, errBadDeviceID("runtimeConfig.deviceID", rc))
		}
	}
	for _, s := range validNames(&errs, Source{c.CNIArgs.RdmaDevName, "CNI_ARGS rdmaDevName"}, Source{argsCNI.RdmaDevName, "args.cni.rdmaDevName"}) {
		switch {
		case req.DevName.Value == "":
			req.DevName = s
		case req.DevName.Value != s.Value:
			errs = append(errs, fmt.Errorf("%s %q and %s %q ask for different names", req.DevName.From, req.DevName.Value, s.From, s.Value))
		}
	}
	if len(errs) > 0 {
		return PodRequest{}, fmt.Errorf("the pod's own settings were refused: %w; nothing was changed", errors.Join(errs...))
	}
	return req, nil
}

// validNames are the sources that are set and valid RDMA device names; an
// invalid one adds its error to errs.
func validNames(errs *[]error, srcs ...Source) []Source {
	var ok []Source
	for _, s := range srcs {
		switch {
		case s.Value == "":
		case !ValidRDMAName(s.Value):
			*errs = append(*errs, errBadName(s.From, s.Value))
		default:
			ok = append(ok, s)
		}
	}
	return ok
}

// argsCNIKeys decodes args.cni into its keys, their values left as they are.
func (c *NetConf) argsCNIKeys() (map[string]json.RawMessage, error) {
	if len(c.ArgsJSON) == 0 || string(c.ArgsJSON) == "null" {
		return nil, nil
	}
	var args struct {
		CNI map[string]json.RawMessage `json:"cni"`
	}
	if err := json.Unmarshal(c.ArgsJSON, &args); err != nil {
		return nil, fmt.Errorf("args is not an object with an object args.cni: %v", err)
	}
	return args.CNI, nil
}

// argsCNI decodes the rdma-netns keys of args.cni. Other keys belong to
// other plugins of the chain and are ignored; ours must be strings.
func (c *NetConf) argsCNI() (PerPodArgs, error) {
	var a PerPodArgs
	keys, err := c.argsCNIKeys()
	if err != nil {
		return a, err
	}
	for key, dst := range map[string]*string{"rdmaDevice": &a.RdmaDevice, "rdmaDevName": &a.RdmaDevName} {
		raw, ok := keys[key]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return PerPodArgs{}, fmt.Errorf("args.cni.%s %s is not a string", key, truncate(string(raw), 70))
		}
	}
	return a, nil
}

// truncate keeps an error readable when the input is not.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func first(srcs ...Source) Source {
	for _, s := range srcs {
		if s.Value != "" {
			return s
		}
	}
	return Source{}
}

func supported(v string) bool {
	for _, s := range SupportedVersions {
		if s == v {
			return true
		}
	}
	return false
}

// parseCNIArgs picks the rdma-netns keys out of CNI_ARGS. Runtimes put
// their own keys there (K8S_POD_NAME, IgnoreUnknown), so unknown keys are
// not an error.
func parseCNIArgs(s string) (PerPodArgs, PodRef, error) {
	var a PerPodArgs
	var pod PodRef
	if s == "" {
		return a, pod, nil
	}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return a, pod, fmt.Errorf("CNI_ARGS entry %s is not KEY=VALUE", Quote(pair))
		}
		switch k {
		case "rdmaDevice":
			a.RdmaDevice = v
		case "rdmaDevName":
			a.RdmaDevName = v
		case "K8S_POD_UID":
			pod.UID = v
		case "K8S_POD_NAMESPACE", "K8S_POD_NAME":
			if !validK8sName(v) {
				return a, pod, fmt.Errorf("CNI_ARGS %s %s is not a Kubernetes name", k, Quote(v))
			}
			if k == "K8S_POD_NAME" {
				pod.Name = v
			} else {
				pod.Namespace = v
			}
		}
	}
	return a, pod, nil
}

// validK8sName accepts a DNS subdomain, what Kubernetes allows for
// namespace and pod names: 1 to 253 of [-a-z0-9.], starting and ending
// with [a-z0-9]. Written out for the reason nameLike is.
func validK8sName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case 'a' <= b && b <= 'z', '0' <= b && b <= '9':
		case (b == '-' || b == '.') && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// DRAPick is which of the pod's NICs a dra network attaches: the
// network's dra.request and dra.index, and where it leaves one unset the
// pod's args.cni draRequest or draIndex. A pod's value where the network
// set its own is refused unless it is the same: the pod may narrow what
// its network allows, never widen it. Only ADD calls it: DEL needs no pick.
func (c *NetConf) DRAPick() (request string, index int, err error) {
	if c.DRA == nil {
		return "", 0, errors.New("the network's configuration has no \"dra\" object")
	}
	request = c.DRA.Request
	if c.DRA.Index != nil {
		index = *c.DRA.Index
	}
	keys, err := c.argsCNIKeys()
	if err != nil {
		return "", 0, podRefused(err)
	}
	if raw, ok := keys["draRequest"]; ok && string(raw) != "null" {
		var r string
		if err := json.Unmarshal(raw, &r); err != nil {
			return "", 0, podRefused(fmt.Errorf("args.cni.draRequest %s is not a string", truncate(string(raw), 70)))
		}
		switch {
		case !validRequest(r):
			return "", 0, podRefused(errBadRequest("args.cni.draRequest", r))
		case c.DRA.Request == "":
			request = r
		case r != c.DRA.Request:
			return "", 0, podRefused(fmt.Errorf("args.cni.draRequest %s: this network attaches a NIC of request %q (its dra.request), and a pod may narrow what its network allows, never widen it", Quote(r), c.DRA.Request))
		}
	}
	if raw, ok := keys["draIndex"]; ok && string(raw) != "null" {
		i, err := strconv.Atoi(string(raw))
		if err != nil || i < 0 || i > maxDRAIndex {
			return "", 0, podRefused(fmt.Errorf("args.cni.draIndex %s is not a whole number from 0 to %d", truncate(string(raw), 70), maxDRAIndex))
		}
		switch {
		case c.DRA.Index == nil:
			index = i
		case i != *c.DRA.Index:
			return "", 0, podRefused(fmt.Errorf("args.cni.draIndex %d: this network attaches the NIC at index %d (its dra.index), and a pod may narrow what its network allows, never widen it", i, *c.DRA.Index))
		}
	}
	return request, index, nil
}

func podRefused(err error) error {
	return fmt.Errorf("the pod's own settings were refused: %w; nothing was changed", err)
}

// validRequest accepts a ResourceClaim request name, or request/subrequest:
// each a DNS label, as the API server allows them.
func validRequest(s string) bool {
	req, sub, hasSub := strings.Cut(s, "/")
	return dnsLabel(req) && (!hasSub || dnsLabel(sub))
}

// dnsLabel is 1 to 63 of [a-z0-9-], starting and ending with [a-z0-9].
func dnsLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case 'a' <= b && b <= 'z', '0' <= b && b <= '9':
		case b == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

func errBadRequest(field, val string) error {
	return fmt.Errorf("%s %s is not a request name (a DNS label, or request/subrequest)", field, Quote(val))
}
