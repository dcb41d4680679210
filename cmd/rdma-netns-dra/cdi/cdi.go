// Package cdi writes the CDI specs (Container Device Interface) through
// which a container that names a claim gets its NICs' device nodes: the
// uverbs node of each NIC's RDMA device and rdma_cm, with nothing of any
// other NIC. The kubelet passes the IDs Prepare returns to the runtime for
// those containers only; the runtime reads the spec from the node's CDI
// directory and fails the container if it cannot resolve an ID.
//
// One spec file per claim, removed on Unprepare. The devices are named by
// the claim's UID, so two claims' specs never collide.
package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

const (
	// DefaultDir is the runtime's directory for specs of the running
	// system (containerd's and CRI-O's default cdi_spec_dirs hold it): a
	// tmpfs, emptied by a reboot, after which the kubelet prepares the
	// claims again.
	DefaultDir = "/var/run/cdi"
	// Vendor and Class make the kind; an ID is Kind=NAME.
	Vendor = "nic.rdma-netns.io"
	Class  = "nic"
	Kind   = Vendor + "/" + Class
	// version is the spec version written: the oldest that has each
	// device node's fileMode.
	version = "0.6.0"
	// mode is what rdma-core's udev rules give the nodes on a node: any
	// user of a container may open them; the device cgroup allows only
	// these.
	mode = 0o666
)

// Device is one NIC of a claim: its device's name in the ResourceSlice and
// the paths of its nodes (/dev/infiniband/uverbsN).
type Device struct {
	Name  string
	Nodes []string
}

// Dir is a CDI spec directory; "" is DefaultDir.
type Dir string

func (d Dir) path() string {
	if d == "" {
		return DefaultDir
	}
	return string(d)
}

// File is where the claim's spec is.
func (d Dir) File(claimUID string) string {
	return filepath.Join(d.path(), Vendor+"-"+claimUID+".json")
}

// ID is the CDI ID of a claim's device, as Prepare returns it.
func ID(claimUID, device string) string { return Kind + "=" + name(claimUID, device) }

func name(claimUID, device string) string { return claimUID + "-" + device }

type spec struct {
	CDIVersion     string     `json:"cdiVersion"`
	Kind           string     `json:"kind"`
	Devices        []specDev  `json:"devices"`
	ContainerEdits *specEdits `json:"containerEdits,omitempty"`
}

type specDev struct {
	Name           string    `json:"name"`
	ContainerEdits specEdits `json:"containerEdits"`
}

type specEdits struct {
	DeviceNodes []specNode `json:"deviceNodes,omitempty"`
}

type specNode struct {
	Path     string      `json:"path"`
	FileMode fs.FileMode `json:"fileMode"`
}

// Write writes the claim's spec: each device's own nodes, and shared the
// nodes every container of the claim gets once (rdma_cm). It replaces the
// file whole (a reader sees the old spec or the new one) and returns the
// devices' IDs in devs' order.
func (d Dir) Write(claimUID string, devs []Device, shared []string) ([]string, error) {
	s := spec{CDIVersion: version, Kind: Kind}
	ids := make([]string, 0, len(devs))
	for _, dev := range devs {
		sd := specDev{Name: name(claimUID, dev.Name)}
		for _, p := range dev.Nodes {
			sd.ContainerEdits.DeviceNodes = append(sd.ContainerEdits.DeviceNodes, specNode{Path: p, FileMode: mode})
		}
		s.Devices = append(s.Devices, sd)
		ids = append(ids, ID(claimUID, dev.Name))
	}
	if len(shared) > 0 {
		s.ContainerEdits = &specEdits{}
		for _, p := range shared {
			s.ContainerEdits.DeviceNodes = append(s.ContainerEdits.DeviceNodes, specNode{Path: p, FileMode: mode})
		}
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.path(), 0o755); err != nil {
		return nil, fmt.Errorf("creating the CDI directory %s: %w", d.path(), err)
	}
	tmp, err := os.CreateTemp(d.path(), ".tmp-"+Vendor+"-")
	if err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec in %s: %w", d.path(), err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), d.File(claimUID)); err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec %s: %w", d.File(claimUID), err)
	}
	return ids, nil
}

// Remove removes the claim's spec; a spec already gone is no error.
func (d Dir) Remove(claimUID string) error {
	if err := os.Remove(d.File(claimUID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the claim's CDI spec: %w", err)
	}
	return nil
}

// Has reports whether the claim's spec is there.
func (d Dir) Has(claimUID string) bool {
	st, err := os.Lstat(d.File(claimUID))
	return err == nil && st.Mode().IsRegular()
}
