// Package handlernet reads the CNI network a containerd runtime handler
// gives its pods, laid out as conf/containerd has it: one conflist in the
// handler's cni_conf_dir, host-device moving one NIC into the pod with a
// static address, rdma-netns after it. conf's tests check conf/containerd
// with it, and the CRI tests (e2e/cri/cririg) read the networks installed in
// the test VM with it. The CNI plugin does not link it.
package handlernet

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
)

// Network is a handler's network.
type Network struct {
	File       string // the conflist
	Name       string // its network name
	CNIVersion string
	// Device is the NIC host-device moves into the pod, "" without
	// host-device.
	Device string
	// Addresses are host-device's static addresses, with their prefix
	// length.
	Addresses []string
	// RdmaNetns says whether rdma-netns is in the chain.
	RdmaNetns bool
}

// Read reads the network of the one conflist in dir, as libcni loads it
// for containerd. A handler loads the first conflist it finds
// (cni_max_conf_num = 1), so a second one would be dead: that is an error.
func Read(dir string) (Network, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.conflist"))
	if err != nil {
		return Network{}, err
	}
	if len(files) != 1 {
		return Network{}, fmt.Errorf("%s: %d conflists, want 1", dir, len(files))
	}
	list, err := libcni.ConfListFromFile(files[0])
	if err != nil {
		return Network{}, fmt.Errorf("%s: %v", files[0], err)
	}
	n := Network{File: files[0], Name: list.Name, CNIVersion: list.CNIVersion}
	for _, p := range list.Plugins {
		switch p.Network.Type {
		case "host-device":
			var hd struct {
				Device string `json:"device"`
				IPAM   struct {
					Addresses []struct {
						Address string `json:"address"`
					} `json:"addresses"`
				} `json:"ipam"`
			}
			if err := json.Unmarshal(p.Bytes, &hd); err != nil {
				return Network{}, fmt.Errorf("%s: host-device: %v", files[0], err)
			}
			n.Device = hd.Device
			for _, a := range hd.IPAM.Addresses {
				n.Addresses = append(n.Addresses, a.Address)
			}
		case "rdma-netns":
			n.RdmaNetns = true
		}
	}
	return n, nil
}
