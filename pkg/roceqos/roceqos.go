// Package roceqos applies RoCE quality-of-service settings to an RDMA device
// after it moved into a pod. Moving a device re-creates its rdma_cm state,
// so a type of service set on the host is lost with the move, and a lossless
// fabric (PFC on a DSCP priority) silently falls back to best effort.
package roceqos

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// Settings are the values to apply; nil fields are left alone.
type Settings struct {
	ToS *int
	TC  *int
}

// configfsMagic is CONFIGFS_MAGIC from linux/magic.h.
const configfsMagic = 0x62656570

// ConfigfsRoot is where configfs is mounted; tests point it elsewhere.
var ConfigfsRoot = "/sys/kernel/config"

// rdma_cm keys its configfs tree by device name across all namespaces, so
// the host's configfs reaches a device that sits in a pod.
func cmDir() string { return filepath.Join(ConfigfsRoot, "rdma_cm") }

// Apply sets the type of service through rdma_cm's configfs and the traffic
// class through the driver's sysfs, on every port of dev, and reads both
// back. dev is the device's current name; nsPath the netns it is in.
func Apply(nsPath, dev string, s Settings) error {
	if s.ToS != nil {
		ports, err := cmPorts(dev, true)
		if err != nil {
			return err
		}
		for _, p := range ports {
			if err := writeInt(filepath.Join(cmDir(), dev, "ports", p, "default_roce_tos"), *s.ToS); err != nil {
				return fmt.Errorf("cannot set the RoCE type of service of %s port %s: %v", dev, p, err)
			}
		}
	}
	if s.TC != nil {
		// The traffic class is in the driver's sysfs, which only a sysfs
		// mounted in the pod's netns shows once the device moved.
		err := podns.Do(nsPath, func(t podns.Thread) error {
			files, err := tcFiles(t.Sysfs, dev)
			if err != nil {
				return err
			}
			for _, f := range files {
				if err := writeInt(f, *s.TC); err != nil {
					return fmt.Errorf("cannot set the traffic class of %s (%s): %v", dev, f, err)
				}
			}
			return nil
		}, podns.WritableSysfs())
		if err != nil {
			return err
		}
	}
	return Verify(nsPath, dev, s)
}

// Verify reads the settings back and names the first port that differs.
func Verify(nsPath, dev string, s Settings) error {
	if s.ToS != nil {
		ports, err := cmPorts(dev, false)
		if err != nil {
			return err
		}
		for _, p := range ports {
			got, err := readInt(filepath.Join(cmDir(), dev, "ports", p, "default_roce_tos"))
			if err != nil {
				return fmt.Errorf("cannot read the RoCE type of service of %s port %s: %v", dev, p, err)
			}
			if got != *s.ToS {
				return fmt.Errorf("RoCE type of service of %s port %s is %d, want %d", dev, p, got, *s.ToS)
			}
		}
	}
	if s.TC != nil {
		return podns.Do(nsPath, func(t podns.Thread) error {
			files, err := tcFiles(t.Sysfs, dev)
			if err != nil {
				return err
			}
			for _, f := range files {
				got, err := readInt(f)
				if err != nil {
					return fmt.Errorf("cannot read the traffic class of %s (%s): %v", dev, f, err)
				}
				if got != *s.TC {
					return fmt.Errorf("traffic class of %s port %s is %d, want %d", dev, filepath.Base(filepath.Dir(f)), got, *s.TC)
				}
			}
			return nil
		}, podns.Sysfs())
	}
	return nil
}

// Remove drops the device's rdma_cm configfs group, if any. The values die
// with the device's next move anyway; this keeps configfs free of groups
// for devices that no longer carry their pod settings.
func Remove(dev string) error {
	err := os.Remove(filepath.Join(cmDir(), dev))
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("cannot remove rdma_cm configfs group of %s: %v", dev, err)
}

// cmPorts returns the port directories of the device's rdma_cm group,
// creating the group (and mounting configfs) when create is set.
func cmPorts(dev string, create bool) ([]string, error) {
	if create {
		if err := ensureConfigfs(); err != nil {
			return nil, err
		}
		if err := os.Mkdir(filepath.Join(cmDir(), dev), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("cannot create rdma_cm configfs group for %s: %v (is %s an RDMA device with RoCE ports?)", dev, err, dev)
		}
	}
	entries, err := os.ReadDir(filepath.Join(cmDir(), dev, "ports"))
	if err != nil {
		return nil, fmt.Errorf("no rdma_cm configfs group for %s: %v", dev, err)
	}
	var ports []string
	for _, e := range entries {
		ports = append(ports, e.Name())
	}
	sort.Strings(ports)
	if len(ports) == 0 {
		return nil, fmt.Errorf("rdma_cm configfs group of %s has no ports", dev)
	}
	return ports, nil
}

func ensureConfigfs() error {
	if _, err := os.Stat(cmDir()); err == nil {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(ConfigfsRoot, &st); err != nil {
		return fmt.Errorf("configfs mount point %s: %v", ConfigfsRoot, err)
	}
	if st.Type != configfsMagic {
		if err := unix.Mount("configfs", ConfigfsRoot, "configfs", 0, ""); err != nil {
			return fmt.Errorf("configfs is not mounted and mounting it on %s failed: %v", ConfigfsRoot, err)
		}
	}
	if _, err := os.Stat(cmDir()); err != nil {
		return fmt.Errorf("%s does not exist: the rdma_cm module is not loaded; load it (modprobe rdma_cm) to set rdmaQoS.tos", cmDir())
	}
	return nil
}

// tcFiles are the driver's per-port traffic class files (mlx5 has them).
func tcFiles(sysfs, dev string) ([]string, error) {
	files, _ := filepath.Glob(filepath.Join(sysfs, "class", "infiniband", dev, "tc", "*", "traffic_class"))
	if len(files) == 0 {
		return nil, fmt.Errorf("the driver of RDMA device %s exposes no traffic class (no tc/<port>/traffic_class in sysfs); remove rdmaQoS.tc and use the type of service (rdmaQoS.tos) or the driver's own tools", dev)
	}
	sort.Strings(files)
	return files, nil
}

func writeInt(path string, v int) error {
	return os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644)
}

// readInt parses a sysfs/configfs number; mlx5 prints "Global tclass=N".
func readInt(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	if i := strings.LastIndexAny(s, "= "); i >= 0 {
		s = s[i+1:]
	}
	return strconv.Atoi(s)
}
