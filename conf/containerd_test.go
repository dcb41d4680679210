package conf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	nodev1 "k8s.io/api/node/v1"

	"github.com/rdma-netns/rdma-netns/pkg/handlernet"
)

// conf/containerd is rdma-netns on a node without Multus: a containerd 2.x
// drop-in with one runtime handler (RuntimeClass) per RDMA NIC, each
// loading its own network from its cni_conf_dir, and the default network in
// net.d. The e2e tests (e2e/cri) install exactly these files in the test
// VM. What containerd reads must hold together, or a pod silently gets the
// wrong NIC, no RDMA device, or NetworkReady stops reflecting rdma-netns.

// dropIn is the part of containerd's config the drop-in may set; anything
// else is a typo containerd would ignore.
type dropIn struct {
	Version int `toml:"version"`
	Plugins struct {
		Runtime struct {
			Containerd struct {
				Runtimes map[string]runtimeHandler `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"io.containerd.cri.v1.runtime"`
	} `toml:"plugins"`
}

type runtimeHandler struct {
	RuntimeType   string `toml:"runtime_type"`
	CNIConfDir    string `toml:"cni_conf_dir"`
	CNIMaxConfNum int    `toml:"cni_max_conf_num"`
}

// checkContainerdSetup checks the directory laid out as conf/containerd:
// rdma-netns.toml, net.d/ (the default network), <handler>.d/ per handler,
// runtimeclasses.yaml.
func checkContainerdSetup(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "rdma-netns.toml"))
	if err != nil {
		return err
	}
	var d dropIn
	dec := toml.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			return fmt.Errorf("rdma-netns.toml: keys containerd does not know here:\n%s", strict.String())
		}
		return fmt.Errorf("rdma-netns.toml: %v", err)
	}
	if d.Version != 3 {
		return fmt.Errorf("rdma-netns.toml: version %d, want 3 (containerd 2.x)", d.Version)
	}
	handlers := d.Plugins.Runtime.Containerd.Runtimes
	if len(handlers) == 0 {
		return errors.New("rdma-netns.toml declares no runtime handler")
	}

	nets := map[string]handlernet.Network{} // handler ("" = default) -> network
	def, err := onlyNetwork(dir, "net.d")
	if err != nil {
		return err
	}
	if !def.RdmaNetns {
		return fmt.Errorf("%s: the default network has no rdma-netns: containerd asks only it for STATUS, so NetworkReady would not reflect rdma-netns", def.File)
	}
	nets[""] = def
	var names []string
	for name, h := range handlers {
		names = append(names, name)
		if h.RuntimeType != "io.containerd.runc.v2" {
			return fmt.Errorf("handler %s: runtime_type %q, want io.containerd.runc.v2", name, h.RuntimeType)
		}
		if want := "/etc/cni/" + name + ".d"; h.CNIConfDir != want {
			return fmt.Errorf("handler %s: cni_conf_dir %q, want %q (conf/containerd/%s.d installed there)", name, h.CNIConfDir, want, name)
		}
		if h.CNIMaxConfNum != 1 {
			return fmt.Errorf("handler %s: cni_max_conf_num %d, want 1: a pod gets one NIC", name, h.CNIMaxConfNum)
		}
		n, err := onlyNetwork(dir, name+".d")
		if err != nil {
			return err
		}
		if !n.RdmaNetns {
			return fmt.Errorf("%s: handler %s's network has no rdma-netns", n.File, name)
		}
		nets[name] = n
	}
	// Every network has its own NIC and address: host-device moves a
	// whole NIC, so two networks on one would fail each other's pods.
	byDevice, byAddr := map[string]string{}, map[string]string{}
	for _, n := range nets {
		if other, ok := byDevice[n.Device]; ok {
			return fmt.Errorf("%s and %s both move NIC %s", other, n.File, n.Device)
		}
		byDevice[n.Device] = n.File
		if other, ok := byAddr[n.Addresses[0]]; ok {
			return fmt.Errorf("%s and %s both assign %s", other, n.File, n.Addresses[0])
		}
		byAddr[n.Addresses[0]] = n.File
	}
	// No network directory that no handler loads.
	dirs, err := filepath.Glob(filepath.Join(dir, "*.d"))
	if err != nil {
		return err
	}
	for _, sub := range dirs {
		name := strings.TrimSuffix(filepath.Base(sub), ".d")
		if _, ok := handlers[name]; !ok && name != "net" {
			return fmt.Errorf("%s: no runtime handler %s loads it", sub, name)
		}
	}
	// One RuntimeClass per handler, and none for a handler that is not there.
	data, err := os.ReadFile(filepath.Join(dir, "runtimeclasses.yaml"))
	if err != nil {
		return err
	}
	objs, err := decodeManifests("runtimeclasses.yaml", data)
	if err != nil {
		return err
	}
	var classes []string
	for _, o := range objs {
		rc, ok := o.obj.(*nodev1.RuntimeClass)
		if !ok {
			return fmt.Errorf("%s: a %s, want RuntimeClass", o.where, o.kind)
		}
		classes = append(classes, rc.Handler)
	}
	sort.Strings(names)
	sort.Strings(classes)
	if !slices.Equal(names, classes) {
		return fmt.Errorf("RuntimeClass handlers %v, runtime handlers %v", classes, names)
	}
	return nil
}

// onlyNetwork reads the one conflist in dir/sub and checks what a handler's
// network needs.
func onlyNetwork(dir, sub string) (handlernet.Network, error) {
	n, err := handlernet.Read(filepath.Join(dir, sub))
	if err != nil {
		return n, err
	}
	// STATUS, which feeds NetworkReady, exists from CNI 1.1.0 on.
	if n.CNIVersion != "1.1.0" {
		return n, fmt.Errorf("%s: cniVersion %q, want 1.1.0 (containerd asks STATUS of 1.1.0 networks only)", n.File, n.CNIVersion)
	}
	if n.Device == "" || len(n.Addresses) != 1 {
		return n, fmt.Errorf("%s: want host-device naming its NIC with one static address", n.File)
	}
	return n, nil
}

func TestContainerdSetup(t *testing.T) {
	if err := checkContainerdSetup("containerd"); err != nil {
		t.Fatal(err)
	}
}

// Each mistake below, made to a copy of conf/containerd, must be caught.
func TestContainerdSetupRejects(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"valid baseline", "rdma-netns.toml", "", "", ""},
		{"typo in a handler key", "rdma-netns.toml", "cni_conf_dir = '/etc/cni/rdma-eth1.d'", "cni_confdir = '/etc/cni/rdma-eth1.d'", "cni_confdir"},
		{"handler loading another handler's directory", "rdma-netns.toml", "'/etc/cni/rdma-eth2.d'", "'/etc/cni/rdma-eth1.d'", "cni_conf_dir"},
		{"several networks per pod", "rdma-netns.toml", "cni_max_conf_num = 1\n\n", "cni_max_conf_num = 0\n\n", "cni_max_conf_num 0"},
		{"two networks on one NIC", "rdma-eth2.d/rdma-eth2.conflist", `"eth2"`, `"eth1"`, "both move NIC eth1"},
		{"default network without rdma-netns", "net.d/rdma-eth0.conflist", `"type": "rdma-netns"`, `"type": "tuning"`, "NetworkReady"},
		{"default network without STATUS", "net.d/rdma-eth0.conflist", `"1.1.0"`, `"1.0.0"`, "cniVersion"},
		{"RuntimeClass for a handler that is not there", "runtimeclasses.yaml", "handler: rdma-eth2", "handler: rdma-eth3", "RuntimeClass handlers"},
		{"old config version", "rdma-netns.toml", "version = 3", "version = 2", "version 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS("containerd")); err != nil {
				t.Fatal(err)
			}
			if tc.old != "" {
				path := filepath.Join(dir, tc.file)
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Contains(data, []byte(tc.old)) {
					t.Fatalf("%s does not contain %q: update the case", tc.file, tc.old)
				}
				if err := os.WriteFile(path, bytes.Replace(data, []byte(tc.old), []byte(tc.new), 1), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := checkContainerdSetup(dir)
			wantRejection(t, "valid setup", err, tc.want)
		})
	}
}
