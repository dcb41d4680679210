package state

import (
	"strings"
	"testing"
)

const k8sContainerID = "3f4e1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"

func TestKeyValidate(t *testing.T) {
	valid := Key{Network: "rdma-net", ContainerID: k8sContainerID, IfName: "net1"}
	with := func(f func(*Key)) Key { k := valid; f(&k); return k }

	tests := []struct {
		name    string
		key     Key
		wantErr string // substring; empty means valid
	}{
		{"k8s container ID", valid, ""},
		{"network with dots and dashes", with(func(k *Key) { k.Network = "sriov-rdma.v2_net" }), ""},
		{"eth0", with(func(k *Key) { k.IfName = "eth0" }), ""},
		{"15 byte ifname", with(func(k *Key) { k.IfName = strings.Repeat("a", 15) }), ""},
		{"253 byte container ID", with(func(k *Key) { k.ContainerID = strings.Repeat("a", 253) }), ""},
		{"ifname with dots", with(func(k *Key) { k.IfName = "net.1" }), ""},

		{"empty network", with(func(k *Key) { k.Network = "" }), "network name: must not be empty"},
		{"empty container ID", with(func(k *Key) { k.ContainerID = "" }), "container ID: must not be empty"},
		{"empty ifname", with(func(k *Key) { k.IfName = "" }), "interface name: must not be empty"},
		{"traversal in network", with(func(k *Key) { k.Network = "../x" }), "invalid network name"},
		{"traversal in container ID", with(func(k *Key) { k.ContainerID = "../../etc/passwd" }), "invalid container ID"},
		{"dotdot container ID", with(func(k *Key) { k.ContainerID = ".." }), "invalid container ID"},
		{"dot network", with(func(k *Key) { k.Network = "." }), "invalid network name"},
		{"slash in network", with(func(k *Key) { k.Network = "a/b" }), "invalid network name"},
		{"slash in container ID", with(func(k *Key) { k.ContainerID = "a/b" }), "invalid container ID"},
		{"NUL in container ID", with(func(k *Key) { k.ContainerID = "abc\x00def" }), "invalid container ID"},
		{"newline in network", with(func(k *Key) { k.Network = "net\nwork" }), "invalid network name"},
		{"space in container ID", with(func(k *Key) { k.ContainerID = "abc def" }), "invalid container ID"},
		{"leading dash", with(func(k *Key) { k.Network = "-net" }), "invalid network name"},
		{"non-ASCII network", with(func(k *Key) { k.Network = "netз" }), "invalid network name"},
		{"254 byte container ID", with(func(k *Key) { k.ContainerID = strings.Repeat("a", 254) }), "254 bytes, at most 253"},
		{"254 byte network", with(func(k *Key) { k.Network = strings.Repeat("n", 254) }), "254 bytes, at most 253"},
		{"16 byte ifname", with(func(k *Key) { k.IfName = strings.Repeat("a", 16) }), "16 bytes, at most 15"},
		{"dot ifname", with(func(k *Key) { k.IfName = "." }), "invalid interface name"},
		{"dotdot ifname", with(func(k *Key) { k.IfName = ".." }), "invalid interface name"},
		{"slash in ifname", with(func(k *Key) { k.IfName = "a/b" }), "invalid interface name"},
		{"colon in ifname", with(func(k *Key) { k.IfName = "eth0:1" }), "invalid interface name"},
		{"space in ifname", with(func(k *Key) { k.IfName = "net 1" }), "invalid interface name"},
		{"tab in ifname", with(func(k *Key) { k.IfName = "net\t1" }), "invalid interface name"},
		{"newline in ifname", with(func(k *Key) { k.IfName = "net1\n" }), "invalid interface name"},
		{"NUL in ifname", with(func(k *Key) { k.IfName = "net\x001" }), "invalid interface name"},
		{"invalid UTF-8 ifname", with(func(k *Key) { k.IfName = "net\xff" }), "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.key.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate(%q) = %v, want nil", tt.key, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%q) = nil, want error containing %q", tt.key, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate(%q) = %q, want it to contain %q", tt.key, err, tt.wantErr)
			}
		})
	}
}

func TestValidateDeviceName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"mlx5_0", true},
		{"rocep59s0f0", true},
		{"ibp59s0f1", true},
		{"mlx5_bond_0", true},
		{strings.Repeat("d", 63), true},
		{strings.Repeat("d", 64), false},
		{"", false},
		{".", false},
		{"..", false},
		{"mlx5/0", false},
		{"../mlx5_0", false},
		{"mlx5 0", false},
		{"mlx5\n", false},
		{"mlx5\x00", false},
	}
	for _, tt := range tests {
		err := ValidateDeviceName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateDeviceName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// ADD takes a pod's interface name only when it is plain; a record an
// older ADD wrote under a name the kernel took must still load, or its
// pod's DEL could not return the device.
func TestValidatePlainIfName(t *testing.T) {
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"net1", true},
		{"eth0.100", true},
		{"rdma_a-1", true},
		{"_x", true},
		{".x", true},
		{strings.Repeat("a", 15), true},
		{strings.Repeat("a", 16), false},
		{"", false},
		{".", false},
		{"..", false},
		{"-x", false},
		{"a;b", false},
		{"x'y", false},
		{"a`id`", false},
		{`b"c`, false},
		{"a$b", false},
		{"a>b", false},
		{"a|b", false},
		{"a&b", false},
		{"a\\b", false},
		{"a*", false},
		{"a b", false},
		{"a:b", false},
		{"netз", false},
		{"net\x01", false},
	} {
		err := ValidatePlainIfName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidatePlainIfName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "invalid interface name") {
			t.Errorf("ValidatePlainIfName(%q) = %v, does not say what is invalid", tt.name, err)
		}
	}
	for _, old := range []string{"a;b", "x'y", "a`id`", "-x", "netз"} {
		k := Key{Network: "rdma-net", ContainerID: k8sContainerID, IfName: old}
		if err := k.Validate(); err != nil {
			t.Errorf("a record of %q no longer loads: %v", old, err)
		}
	}
}

func TestKeyString(t *testing.T) {
	k := Key{Network: "net", ContainerID: "cid", IfName: "net1"}
	if got, want := k.String(), "net/cid/net1"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestFileNameUnambiguous(t *testing.T) {
	// Plain concatenation with any in-alphabet separator would map these
	// to the same name.
	keys := []Key{
		{Network: "a-b", ContainerID: "c", IfName: "net1"},
		{Network: "a", ContainerID: "b-c", IfName: "net1"},
		{Network: "a.b", ContainerID: "c", IfName: "net1"},
		{Network: "a", ContainerID: "b.c", IfName: "net1"},
		{Network: "a", ContainerID: "bc", IfName: "net1"},
		{Network: "ab", ContainerID: "c", IfName: "net1"},
	}
	seen := map[string]Key{}
	for _, k := range keys {
		name := k.fileName()
		if !isRecordFileName(name) {
			t.Errorf("fileName(%s) = %q is not recognized by isRecordFileName", k, name)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("keys %s and %s share file name %s", k, other, name)
		}
		seen[name] = k
	}
	for _, name := range []string{"lock", ".tmp-123", "README.json", strings.Repeat("A", 64) + ".json", strings.Repeat("a", 63) + ".json"} {
		if isRecordFileName(name) {
			t.Errorf("isRecordFileName(%q) = true, want false", name)
		}
	}
}
