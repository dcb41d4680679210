package node

import "testing"

// vm-run.sh's /etc/vm.conf as the rig writes it (scripts/README.md).
func TestVMConf(t *testing.T) {
	conf := "VM_NETNS_MODE=exclusive\nVM_NICS=3\nVM_DISK_DIRS=\"/var/lib/kubelet /var/log\"\nVM_NODE=2\nVM_LINK=127.0.0.1:13748:13747\nVM_RAILS=2\nVM_ARP_DEFAULTS=1\n"
	for _, c := range []struct {
		key        string
		least, def int
		want       int
		wantValue  string
	}{
		{"VM_NODE", 1, 1, 2, "2"},
		{"VM_RAILS", 0, 0, 2, "2"},
		{"VM_ARP_DEFAULTS", 0, 0, 1, "1"},
		{"VM_DISK_DIRS", 0, 7, 7, "/var/lib/kubelet /var/log"},
		{"VM_ABSENT", 1, 1, 1, ""},
	} {
		if got := vmConfInt(conf, c.key, c.least, c.def); got != c.want {
			t.Errorf("vmConfInt(%s) = %d, want %d", c.key, got, c.want)
		}
		if got := vmConfValue(conf, c.key); got != c.wantValue {
			t.Errorf("vmConfValue(%s) = %q, want %q", c.key, got, c.wantValue)
		}
	}
	// Without --rails and --node (today's one-node VM): the defaults.
	old := "VM_NETNS_MODE=exclusive\nVM_NICS=9\n"
	if n := vmConfInt(old, "VM_NODE", 1, 1); n != 1 {
		t.Errorf("VM_NODE absent: %d, want 1", n)
	}
	if n := vmConfInt(old, "VM_RAILS", 0, 0); n != 0 {
		t.Errorf("VM_RAILS absent: %d, want 0", n)
	}
	if n := vmConfInt("VM_NODE=0\n", "VM_NODE", 1, 1); n != 1 {
		t.Errorf("VM_NODE=0: %d, want 1 (vm-run.sh's nodes start at 1)", n)
	}
}
