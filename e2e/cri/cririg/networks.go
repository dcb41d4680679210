package cririg

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/handlernet"
)

// Network is the CNI network a runtime handler's pods get: the conflist
// containerd loads from the handler's cni_conf_dir (/etc/cni/net.d for the
// default handler, "").
type Network struct {
	Handler string
	Name    string // the conflist's network name
	Netdev  string // host-device's device
	IP      string // static IPAM's address, without the prefix length
	RDMA    string // the RDMA device of Netdev in the test VM
}

// NetworkOf reads the network of handler from the conf/containerd files
// cri-setup.sh installed (the default network for handler "").
func NetworkOf(handler string) (Network, error) {
	dir := "/etc/cni/net.d"
	if handler != "" {
		dir = "/etc/cni/" + handler + ".d"
	}
	conf, err := handlernet.Read(dir)
	if err != nil {
		return Network{}, err
	}
	if conf.Device == "" {
		return Network{}, fmt.Errorf("%s: no host-device with a device", conf.File)
	}
	n := Network{Handler: handler, Name: conf.Name, Netdev: conf.Device}
	if len(conf.Addresses) > 0 {
		n.IP, _, _ = strings.Cut(conf.Addresses[0], "/")
	}
	nics, err := rig.Layout()
	if err != nil {
		return Network{}, err
	}
	for _, nic := range nics {
		if nic.Netdev == n.Netdev {
			n.RDMA = nic.RDMA
		}
	}
	if n.RDMA == "" {
		return Network{}, fmt.Errorf("%s: the VM has no RDMA device for %s", conf.File, n.Netdev)
	}
	return n, nil
}

// VerbsDevices are the device nodes a container needs to use the RDMA
// device dev that is in the pod netns netnsPath, as an RDMA device plugin
// hands them over: /dev/infiniband/uverbsN of dev and rdma_cm.
func VerbsDevices(netnsPath, dev string) ([]string, error) {
	out, err := rig.InPod(netnsPath, "sh", "-c", "grep -lx "+dev+" /sys/class/infiniband_verbs/uverbs*/ibdev").Output()
	if err != nil {
		return nil, fmt.Errorf("no uverbs device of %s in %s: %v", dev, netnsPath, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 1 {
		return nil, fmt.Errorf("uverbs devices of %s in %s: %q", dev, netnsPath, out)
	}
	return []string{"/dev/infiniband/" + filepath.Base(filepath.Dir(f[0])), "/dev/infiniband/rdma_cm"}, nil
}
