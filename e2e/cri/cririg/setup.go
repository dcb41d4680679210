package cririg

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Setup prepares the guest for containerd once per boot: it runs
// cri-setup.sh (cgroup v2, /etc/hosts, containerd's tmpfs, conf/containerd
// installed in /etc) and builds the images. Later calls do nothing.
func Setup() error {
	done := filepath.Join(Dir, "setup-done")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("/bin/sh", SetupPath).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s", SetupPath, err, out)
	}
	if err := BuildImages(); err != nil {
		return fmt.Errorf("build the images: %v", err)
	}
	return os.WriteFile(done, nil, 0o644)
}

// NetnsMode is the VM's RDMA netns mode, exclusive or shared, as vm-run.sh
// wrote it in /etc/vm.conf (scripts/README.md); "" outside the test VM.
func NetnsMode() string {
	data, _ := os.ReadFile("/etc/vm.conf")
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VM_NETNS_MODE="); ok {
			return v
		}
	}
	return ""
}
