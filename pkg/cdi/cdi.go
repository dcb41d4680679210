// Package cdi writes the Container Device Interface specs through which a
// claim of rdma-netns-dra gives the containers that name it the verbs
// device nodes of its NICs, with no NRI plugin. Prepare returns one CDI
// device per NIC and the kubelet passes their IDs to the runtime with
// each container; the spec behind an ID is written only once the NIC is
// in the pod, by the CNI ADD that attached it, because the kernel makes a
// device's uverbs node anew when the device changes netns (the lowest
// free number, so two devices moving at once can swap theirs). Until
// then the ID resolves to nothing, and the runtime refuses the container
// ("CDI device injection failed"): a pod whose sandbox was made without
// its NICs (the attach never ran) starts no container.
//
// A file per NIC, named for its claim's UID and its device: the ADD that
// attached the NIC writes it, the driver's Unprepare removes its claim's.
// The runtime drops every device that two spec files name, so a CDI
// device's name carries its claim's UID.
package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

const (
	// Kind is the driver's CDI vendor and class: the IDs are
	// nic.rdma-netns.io/nic=<claim UID>-<device>.
	Kind = "nic.rdma-netns.io/nic"
	// DefaultDir is the directory of generated specs that containerd and
	// CRI-O read by default (with /etc/cdi, left to the node's admin).
	DefaultDir = "/var/run/cdi"
	// version is the spec version the files declare: 0.5.0 is the first
	// with everything written here, and every runtime of the support
	// window reads it.
	version = "0.5.0"
	// filePrefix starts every file this package writes: Remove and Sweep
	// touch no other.
	filePrefix = "nic.rdma-netns.io_nic_"
	// nodeMode is rdma-core's udev mode for the verbs nodes, the NRI
	// plugin's too: a container's non-root user opens them; the device
	// cgroup rule keeps the container to the claim's nodes.
	nodeMode = fs.FileMode(0o666)
)

// Node is a character device of the RDMA subsystem: its name under
// /dev/infiniband and its numbers, as the kernel gave them.
type Node struct {
	Name         string
	Major, Minor uint32
}

// The spec's shape (the CDI specification's JSON), only what is written.
type spec struct {
	Version        string   `json:"cdiVersion"`
	Kind           string   `json:"kind"`
	Devices        []device `json:"devices"`
	ContainerEdits edits    `json:"containerEdits,omitzero"`
}

type device struct {
	Name           string `json:"name"`
	ContainerEdits edits  `json:"containerEdits"`
}

type edits struct {
	DeviceNodes []deviceNode `json:"deviceNodes,omitempty"`
}

type deviceNode struct {
	Path        string      `json:"path"`
	Type        string      `json:"type"`
	Major       int64       `json:"major"`
	Minor       int64       `json:"minor"`
	FileMode    fs.FileMode `json:"fileMode"`
	Permissions string      `json:"permissions"`
}

func (n Node) deviceNode() deviceNode {
	return deviceNode{Path: "/dev/infiniband/" + n.Name, Type: "c", Major: int64(n.Major), Minor: int64(n.Minor), FileMode: nodeMode, Permissions: "rw"}
}

// Dir is a CDI spec directory on the node.
type Dir struct {
	Path string
}

// ID is the CDI device ID of the claim's device.
func ID(claimUID, device string) string {
	return Kind + "=" + claimUID + "-" + device
}

// safe is what a claim's UID and a ResourceSlice device name are made
// of; anything else is not put into a file name.
func safe(s string) bool {
	return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") == "" && s[0] != '.'
}

func (d Dir) file(claimUID, device string) string {
	return filepath.Join(d.Path, filePrefix+claimUID+"_"+device+".json")
}

// Write writes the spec of the claim's device: its uverbs node and, when
// the kernel has one, rdma_cm (RDMA CM address resolution, which
// ib_write_bw -R and NCCL's and UCX's connection setup use). The numbers
// are the kernel's, so the runtime looks nothing up on the host. The file
// appears whole (a rename): the runtime may read the directory at any
// moment.
func (d Dir) Write(claimUID, dev string, uverbs Node, rdmaCM *Node) error {
	if !safe(claimUID) || !safe(dev) {
		return fmt.Errorf("CDI spec for claim %q, device %q: not a claim UID and a device name", claimUID, dev)
	}
	if !strings.HasPrefix(uverbs.Name, "uverbs") || strings.ContainsAny(uverbs.Name, "/\x00") {
		return fmt.Errorf("CDI spec for device %s: %q is not a verbs node", dev, uverbs.Name)
	}
	s := spec{Version: version, Kind: Kind, Devices: []device{{
		Name:           claimUID + "-" + dev,
		ContainerEdits: edits{DeviceNodes: []deviceNode{uverbs.deviceNode()}},
	}}}
	if rdmaCM != nil {
		s.ContainerEdits.DeviceNodes = []deviceNode{rdmaCM.deviceNode()}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.Path, 0o755); err != nil {
		return fmt.Errorf("writing the CDI spec of device %s: %w", dev, err)
	}
	tmp, err := os.CreateTemp(d.Path, ".tmp-"+filePrefix+"*")
	if err != nil {
		return fmt.Errorf("writing the CDI spec of device %s in %s: %w", dev, d.Path, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), d.file(claimUID, dev))
	}
	if err != nil {
		return fmt.Errorf("writing the CDI spec of device %s in %s: %w", dev, d.Path, err)
	}
	return nil
}

// RemoveDevice removes the spec of the claim's device; one already gone
// is no error.
func (d Dir) RemoveDevice(claimUID, dev string) error {
	if !safe(claimUID) || !safe(dev) {
		return nil
	}
	err := os.Remove(d.file(claimUID, dev))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Remove removes the specs of every device of the claim; none is no
// error (the kubelet unprepares again after its restart).
func (d Dir) Remove(claimUID string) error {
	if !safe(claimUID) {
		return nil
	}
	_, err := d.sweep(func(uid string) bool { return uid != claimUID })
	return err
}

// Sweep removes the specs of claims not in keep (the claims with a
// record): left by a driver that stopped between a record's removal and
// its specs'. It returns the UIDs whose specs it removed.
func (d Dir) Sweep(keep map[string]bool) ([]string, error) {
	return d.sweep(func(uid string) bool { return keep[uid] })
}

func (d Dir) sweep(keep func(uid string) bool) ([]string, error) {
	ents, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), filePrefix)
		if !ok || !strings.HasSuffix(rest, ".json") {
			continue
		}
		uid, _, ok := strings.Cut(rest, "_")
		if !ok || keep(uid) {
			continue
		}
		if err := os.Remove(filepath.Join(d.Path, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return gone, err
		}
		if len(gone) == 0 || gone[len(gone)-1] != uid {
			gone = append(gone, uid)
		}
	}
	return gone, nil
}
