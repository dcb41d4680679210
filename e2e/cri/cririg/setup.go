package cririg

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
