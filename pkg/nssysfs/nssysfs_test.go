package nssysfs

import (
	"os"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
)

// In shows the netdevs of the target netns (a fresh one has only
// lo) and leaves the caller's own view of /sys and its netns alone.
func TestIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a netns and mounts sysfs")
	}
	target, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(target)
	defer target.Close()
	before, err := inventory.Stat("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	hostNet := classNet(t, "/sys")
	for i := 0; i < 3; i++ { // new threads each time, none left behind in the netns
		var inside []string
		if err := In(target.Path(), func(root string) error {
			inside = classNet(t, root)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(inside, []string{"lo"}) {
			t.Fatalf("class/net in the new netns = %v, want [lo]", inside)
		}
	}
	if got := classNet(t, "/sys"); !slices.Equal(got, hostNet) {
		t.Fatalf("host /sys/class/net changed: %v -> %v", hostNet, got)
	}
	if after, _ := inventory.Stat("/proc/self/ns/net"); after != before {
		t.Fatal("the caller's main thread left its netns")
	}
	if err := In("/nonexistent", func(string) error { return nil }); err == nil {
		t.Fatal("no error for a missing netns")
	}
}

func classNet(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(root + "/class/net")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
