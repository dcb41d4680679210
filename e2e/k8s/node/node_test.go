package node

import (
	"strings"
	"testing"
)

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

// The rails' layout as vm-pair.sh's --rails 2 --arp-defaults and 5 NICs
// write it, and each part of it lost.
func TestRailsMissing(t *testing.T) {
	full := "VM_NETNS_MODE=exclusive\nVM_NICS=5\nVM_NODE=1\nVM_LINK=127.0.0.1:13747:13748\nVM_RAILS=2\nVM_ARP_DEFAULTS=1\n"
	if why := railsMissing(full, 2, 5); why != "" {
		t.Fatalf("the full layout: %q", why)
	}
	for _, c := range []struct{ conf, want string }{
		{strings.Replace(full, "VM_RAILS=2\n", "", 1), "VM_RAILS=0, want 2 (vm-run.sh --rails 2)"},
		{strings.Replace(full, "VM_RAILS=2", "VM_RAILS=1", 1), "VM_RAILS=1, want 2"},
		{strings.Replace(full, "VM_ARP_DEFAULTS=1\n", "", 1), "no VM_ARP_DEFAULTS=1 (vm-run.sh --arp-defaults)"},
		{strings.Replace(full, "VM_NICS=5", "VM_NICS=3", 1), "VM_NICS=3, want 5"},
		{"", "VM_RAILS=0, want 2 (vm-run.sh --rails 2), no VM_ARP_DEFAULTS=1 (vm-run.sh --arp-defaults), VM_NICS=0, want 5"},
	} {
		if why := railsMissing(c.conf, 2, 5); !strings.Contains(why, c.want) || !strings.HasPrefix(why, "/etc/vm.conf has ") {
			t.Errorf("%q: %q, want it to say %q", c.conf, why, c.want)
		}
	}
}
