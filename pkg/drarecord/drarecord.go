// Package drarecord is what rdma-netns-dra, the node's DRA driver, tells
// the rdma-netns CNI plugin: which NICs kubelet prepared for which pod.
//
// The driver writes one file per prepared ResourceClaim when kubelet calls
// Prepare (before the pod's sandbox exists) and removes it on Unprepare
// (after the sandbox is gone). The plugin, in a network whose config has
// "dra", reads the files of the pod it is called for (CNI_ARGS'
// K8S_POD_UID) to learn which NIC to attach. The files live on the node's
// disk: kubelet does not prepare a claim again after its own restart or
// the node's reboot, so the pod's new sandbox finds its NICs here.
//
// The records say what the driver allocated, not where a device is: the
// kernel is the truth about that, and the plugin's own records (package
// state) say what it moved.
package drarecord

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// DefaultDir is beside the plugin's own state directory, on the node's
// disk: it must outlive a reboot.
const DefaultDir = "/var/lib/cni/rdma-netns-dra"

// DriverName is the name rdma-netns-dra registers with kubelet and
// publishes its devices under.
const DriverName = "nic.rdma-netns.io"

// Version is the record format; a record of another version is skipped.
const Version = 1

const (
	dirPerm  = 0o700
	filePerm = 0o600
	suffix   = ".json"
	tmpMark  = ".tmp-"
	// maxRecordSize bounds what Load reads: a claim holds at most 32
	// results of ours, each a few hundred bytes.
	maxRecordSize = 1 << 20
)

// Claim is one prepared ResourceClaim: the pod it is reserved for and the
// devices of this driver allocated to it.
type Claim struct {
	Version        int    `json:"version"`
	ClaimUID       string `json:"claimUID"`
	ClaimNamespace string `json:"claimNamespace"`
	ClaimName      string `json:"claimName"`
	// PodClaimName is the pod's name for the claim (spec.resourceClaims[].name),
	// from the claim's resource.kubernetes.io/pod-claim-name annotation;
	// "" for a claim the pod names directly.
	PodClaimName string   `json:"podClaimName,omitempty"`
	PodUID       string   `json:"podUID"`
	PodNamespace string   `json:"podNamespace"`
	PodName      string   `json:"podName"`
	Devices      []Device `json:"devices"`
	// Attach is set when the claim or its class configures this driver
	// (a NICConfig): the claim alone gives its NICs to the pod, and the
	// "claims" entry of the node's primary network attaches them when the
	// pod's sandbox is made. A claim without one is attached by a NAD's
	// dra mode.
	Attach bool `json:"attach,omitempty"`
	// CDIDir is where the ADD that attaches each of the claim's NICs
	// writes its CDI spec (package cdi): Prepare gave the kubelet a CDI
	// device per NIC, which resolves once the NIC is in the pod. "" when
	// the driver gives no CDI devices.
	CDIDir string `json:"cdiDir,omitempty"`
}

// Device is one allocation result of this driver.
type Device struct {
	// Request is the result's request name as the claim has it
	// ("nics", or "nics/sub" for a subrequest).
	Request string `json:"request"`
	Pool    string `json:"pool"`
	// Device is the device's name in the ResourceSlice.
	Device string `json:"device"`
	// PCIAddress is the NIC's PCI function: what host-device takes as
	// pciBusID. It is the device's identity; netdev and RDMA names are
	// what the host called it at Prepare.
	PCIAddress string `json:"pciAddress"`
	Netdev     string `json:"netdev"`
	RdmaDevice string `json:"rdmaDevice"`
	// Config is what the NIC becomes in the pod, from the claim's and its
	// class's configuration (package draconfig), checked at Prepare; nil
	// in a record written before the driver read any.
	Config *NIC `json:"config,omitempty"`
}

// NIC is what a device becomes in the pod, resolved from its claim's and
// class's configuration by package draconfig when the claim is prepared.
// Empty fields keep the host's value.
type NIC struct {
	InterfaceName string          `json:"interfaceName"`
	RdmaDevName   string          `json:"rdmaDevName,omitempty"`
	RdmaQoS       *QoS            `json:"rdmaQoS,omitempty"`
	MTU           *int            `json:"mtu,omitempty"`
	ARP           *ARP            `json:"arp,omitempty"`
	Addresses     string          `json:"addresses,omitempty"`
	IPAM          json.RawMessage `json:"ipam,omitempty"`
}

// AddressesHost is NIC.Addresses asking for the NIC's host addresses
// and routes, carried into the pod and back.
const AddressesHost = "host"

// QoS is the RoCE type of service and traffic class in the pod.
type QoS struct {
	ToS *int `json:"tos,omitempty"`
	TC  *int `json:"tc,omitempty"`
}

// ARP is the interface's arp_ignore and arp_announce in the pod.
type ARP struct {
	Ignore   *int `json:"ignore,omitempty"`
	Announce *int `json:"announce,omitempty"`
}

// RequestMatches reports whether the result's request is req, or a
// subrequest of req.
func (d Device) RequestMatches(req string) bool {
	return d.Request == req || strings.HasPrefix(d.Request, req+"/")
}

// Check refuses a record the plugin could not use; the driver checks
// before it writes, Load after it reads.
func (c *Claim) Check() error {
	if c.Version != Version {
		return fmt.Errorf("record version %d, want %d", c.Version, Version)
	}
	if err := checkUID("claim UID", c.ClaimUID); err != nil {
		return err
	}
	if err := checkUID("pod UID", c.PodUID); err != nil {
		return err
	}
	for i, d := range c.Devices {
		if d.PCIAddress == "" || d.Request == "" {
			return fmt.Errorf("device %d of claim %s has no PCI address or request", i, c.ClaimUID)
		}
	}
	return nil
}

// checkUID accepts what Kubernetes generates (a UUID) and refuses anything
// that could leave the directory as a file name.
func checkUID(what, uid string) error {
	if uid == "" || len(uid) > 64 {
		return fmt.Errorf("%s %q: want 1-64 characters", what, uid)
	}
	for _, r := range uid {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return fmt.Errorf("%s %q: want letters, digits and '-'", what, uid)
		}
	}
	return nil
}

// CheckPodUID checks K8S_POD_UID before it is used to find records.
func CheckPodUID(uid string) error { return checkUID("pod UID", uid) }

// Dir is a record directory.
type Dir string

func (d Dir) path() string {
	if d == "" {
		return DefaultDir
	}
	return string(d)
}

func (d Dir) file(claimUID string) string {
	return filepath.Join(d.path(), claimUID+suffix)
}

// Write records c, replacing an earlier record of the same claim
// atomically, and syncs it to disk: a reboot right after Prepare must not
// lose it.
func (d Dir) Write(c *Claim) error {
	if err := c.Check(); err != nil {
		return err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.path(), dirPerm); err != nil {
		return fmt.Errorf("creating DRA record directory: %w", err)
	}
	if err := ReplaceFile(d.file(c.ClaimUID), data, filePerm); err != nil {
		return err
	}
	return syncDir(d.path())
}

// ReplaceFile writes data to path through a synced temporary file of the
// same directory renamed over it, so a reader sees the old content or the
// new, never a part; its directory must exist. The temporary file's name
// starts with ".tmp-", which List skips.
func ReplaceFile(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), tmpMark+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Remove forgets the claim; a claim never recorded is not an error.
func (d Dir) Remove(claimUID string) error {
	if err := checkUID("claim UID", claimUID); err != nil {
		return err
	}
	err := os.Remove(d.file(claimUID))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Load reads the claim's record; ok is false when there is none.
func (d Dir) Load(claimUID string) (c *Claim, ok bool, err error) {
	if err := checkUID("claim UID", claimUID); err != nil {
		return nil, false, err
	}
	c, err = readClaim(d.file(claimUID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return c, true, nil
}

func readClaim(path string) (*Claim, error) {
	data, err := ReadRegular(path, maxRecordSize)
	if err != nil {
		return nil, err
	}
	var c Claim
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return &c, nil
}

// ErrNotRegular is what ReadRegular returns, wrapped with the path, for
// anything but a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ReadRegular reads path, a regular file of at most limit bytes. Whoever
// can write to a directory of records can put anything there under a
// record's name, and every reader (the driver's Prepare, holding its
// lock; the CNI plugin's ADD; the doctor; the exporter) must get an error
// for it, not hang: opening a FIFO blocks until a writer comes, and a
// device may do anything when opened. So it looks before it opens, and
// refuses a symbolic link too, which nothing of ours writes and which
// would let whoever planted it choose what is read. The open itself
// neither blocks nor follows a link, and the opened file is looked at
// again, in case it was swapped between the look and the open. A missing
// file is an fs.ErrNotExist error.
func ReadRegular(path string, limit int64) ([]byte, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if err := regular(path, st, limit); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: %w (a symbolic link)", path, ErrNotRegular)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := regular(path, st, limit); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return data, nil
}

func regular(path string, st fs.FileInfo, limit int64) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, fileKind(st.Mode()))
	}
	if st.Size() > limit {
		return fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return nil
}

// fileKind names what a file that is not regular is, for the operator
// who has to find out who put it there.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

// List reads every record, sorted by claim UID. A damaged record is
// skipped and reported in bad (path: why): it must never block the pods
// whose records are whole.
func (d Dir) List() (claims []*Claim, bad []string, err error) {
	ents, err := os.ReadDir(d.path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, suffix) || strings.HasPrefix(name, tmpMark) {
			continue
		}
		c, err := readClaim(filepath.Join(d.path(), name))
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		if c.ClaimUID+suffix != name {
			bad = append(bad, fmt.Sprintf("%s: holds claim %s", name, c.ClaimUID))
			continue
		}
		claims = append(claims, c)
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].ClaimUID < claims[j].ClaimUID })
	return claims, bad, nil
}

// PodDevices is every device recorded for the pod, its claims in the
// order of their pod claim names (then claim names), each claim's devices
// in allocation order.
func (d Dir) PodDevices(podUID string) ([]Device, []*Claim, error) {
	if err := CheckPodUID(podUID); err != nil {
		return nil, nil, err
	}
	all, _, err := d.List()
	if err != nil {
		return nil, nil, err
	}
	var mine []*Claim
	for _, c := range all {
		if c.PodUID == podUID {
			mine = append(mine, c)
		}
	}
	sort.SliceStable(mine, func(i, j int) bool {
		if mine[i].PodClaimName != mine[j].PodClaimName {
			return mine[i].PodClaimName < mine[j].PodClaimName
		}
		return mine[i].ClaimName < mine[j].ClaimName
	})
	var devs []Device
	for _, c := range mine {
		devs = append(devs, c.Devices...)
	}
	return devs, mine, nil
}

// Pick chooses the pod's device for one attachment: the index-th device
// (from 0) of request, or of all the pod's devices when request is "".
// The error names only the pod's own requests.
func Pick(devs []Device, request string, index int) (Device, error) {
	var match []Device
	for _, d := range devs {
		if request == "" || d.RequestMatches(request) {
			match = append(match, d)
		}
	}
	if index < 0 || index >= len(match) {
		return Device{}, fmt.Errorf("the pod holds %d NIC(s)%s from driver %s, so there is no NIC at index %d; its requests: %s",
			len(match), forRequest(request), DriverName, index, requests(devs))
	}
	return match[index], nil
}

func forRequest(r string) string {
	if r == "" {
		return ""
	}
	return fmt.Sprintf(" for request %q", r)
}

func requests(devs []Device) string {
	seen := map[string]int{}
	var order []string
	for _, d := range devs {
		if seen[d.Request] == 0 {
			order = append(order, d.Request)
		}
		seen[d.Request]++
	}
	if len(order) == 0 {
		return "none (no claim of the pod was prepared by this driver on this node)"
	}
	parts := make([]string, len(order))
	for i, r := range order {
		parts[i] = fmt.Sprintf("%q (%d)", r, seen[r])
	}
	return strings.Join(parts, ", ")
}
