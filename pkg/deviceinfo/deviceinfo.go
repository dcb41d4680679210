// Package deviceinfo writes the device-info file of the Kubernetes Network
// Plumbing WG device-info spec, which Multus copies into the pod's
// network-status annotation so the workload can find its RDMA device.
package deviceinfo

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// SpecVersion is the device-info spec version written.
const SpecVersion = "1.1.0"

// Write records rdmaDev in the file at path. A device plugin may already have
// written the file (with the PCI address and more); its fields are kept and
// only rdma-device is set. Otherwise a pci entry is created.
func Write(path, pciAddress, rdmaDev string) error {
	doc := map[string]any{}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("device-info file %s exists but is not valid JSON: %v", path, err)
		}
		if doc == nil { // the file held JSON null
			doc = map[string]any{}
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return fmt.Errorf("failed to read device-info file %s: %v", path, err)
	}
	if t, ok := doc["type"]; ok && t != "pci" {
		return fmt.Errorf("device-info file %s describes a %v device; rdma-netns only extends pci entries", path, t)
	}
	doc["type"] = "pci"
	if _, ok := doc["version"]; !ok {
		doc["version"] = SpecVersion
	}
	pci, _ := doc["pci"].(map[string]any)
	if pci == nil {
		pci = map[string]any{}
	}
	if _, ok := pci["pci-address"]; !ok && pciAddress != "" {
		pci["pci-address"] = pciAddress
	}
	pci["rdma-device"] = rdmaDev
	doc["pci"] = pci
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("failed to create the directory of device-info file %s: %v", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return fmt.Errorf("failed to write device-info file %s: %v", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("failed to write device-info file %s: %v", path, err)
	}
	return nil
}
