package podns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns/podnstest"
)

// The main goroutine keeps the main thread: TestMain, and the helper
// process it may be (onMainThread), start on it.
func init() { runtime.LockOSThread() }

func TestMain(m *testing.M) {
	if variant := os.Getenv(helperEnv); variant != "" {
		os.Exit(onMainThread(variant, os.Getenv(helperNetnsEnv)))
	}
	os.Exit(m.Run())
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and mounts sysfs")
	}
}

// newNetns creates a netns with a netdev of its own besides lo: the two
// ends of a veth called name and name+"-p" (the kernel may lack dummy).
func newNetns(t *testing.T, name string) ns.NetNS {
	t.Helper()
	needRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	h, err := netlink.NewHandleAt(netns.NsHandle(n.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-p"}); err != nil {
		t.Fatalf("veth %s in %s: %v", name, n.Path(), err)
	}
	return n
}

// ino identifies the namespace behind a /proc or nsfs path, 0 if none.
// It does not stop the test: fn may run on a goroutine of Do's.
func ino(path string) uint64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// threadNetns is the calling thread's netns.
func threadNetns() uint64 { return ino("/proc/thread-self/ns/net") }

// tasksIn lists the process's threads whose netns is the one with inode
// want.
func tasksIn(t *testing.T, want uint64) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var in []string
	for _, task := range tasks {
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc/self/task", task.Name(), "ns/net"), &st) == nil && st.Ino == want {
			in = append(in, task.Name())
		}
	}
	return in
}

// On the caller's thread fn runs in the pod's netns with a handle on the
// netns it came from, and the thread always comes back, also when fn
// fails: what follows must talk to the host again.
func TestCallerThreadReturnsToTheHost(t *testing.T) {
	pod := newNetns(t, "podns-c")
	// Held across the visits, so the checks below look at the thread Do
	// used (LockOSThread nests).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, tid := threadNetns(), unix.Gettid()
	boom := errors.New("boom")
	for _, ret := range []error{nil, boom} {
		err := Do(pod.Path(), func(th Thread) error {
			if got := unix.Gettid(); got != tid {
				t.Errorf("fn runs on thread %d, want the caller's %d", got, tid)
			}
			if got := threadNetns(); got != ino(pod.Path()) {
				t.Errorf("fn runs in netns %d, want the pod's %d", got, ino(pod.Path()))
			}
			if got := ino(fmt.Sprintf("/proc/self/fd/%d", th.From)); got != host {
				t.Errorf("fn is handed netns %d as the one it came from, want %d", got, host)
			}
			return ret
		}, CallerThread())
		if !errors.Is(err, ret) || (ret == nil && err != nil) {
			t.Errorf("Do returned %v, want %v", err, ret)
		}
		if got := threadNetns(); got != host {
			t.Errorf("after Do (fn returning %v) the thread is in netns %d, want the host's %d", ret, got, host)
		}
	}
}

// By default fn runs on another thread in the pod's netns, the caller's
// thread never moves, and the thread fn ran on is back in its own netns
// by the time Do returns: no thread of the process is left in the pod.
func TestNewThreadComesBack(t *testing.T) {
	pod := newNetns(t, "podns-n")
	podIno := ino(pod.Path())
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, tid := threadNetns(), unix.Gettid()
	boom := errors.New("boom")
	for _, ret := range []error{nil, boom} {
		err := Do(pod.Path(), func(Thread) error {
			if unix.Gettid() == tid {
				t.Error("fn runs on the caller's thread")
			}
			if got := threadNetns(); got != podIno {
				t.Errorf("fn runs in netns %d, want the pod's %d", got, podIno)
			}
			return ret
		})
		if !errors.Is(err, ret) || (ret == nil && err != nil) {
			t.Errorf("Do returned %v, want %v", err, ret)
		}
		if got := threadNetns(); got != host {
			t.Errorf("the caller's thread is in netns %d, want the host's %d", got, host)
		}
		if in := tasksIn(t, podIno); len(in) != 0 {
			t.Errorf("after Do (fn returning %v) threads %v are still in the pod's netns", ret, in)
		}
	}
}

// With Discard the thread fn ran on ends instead of going back to the Go
// runtime, so nothing else ever runs on it.
func TestDiscardEndsTheThread(t *testing.T) {
	pod := newNetns(t, "podns-d")
	for _, opt := range []Option{Discard(), Sysfs(), WritableSysfs()} {
		var tid int
		if err := Do(pod.Path(), func(Thread) error { tid = unix.Gettid(); return nil }, opt); err != nil {
			t.Fatal(err)
		}
		// The goroutine reports fn's end before it exits, and its thread
		// with it; the deadline only bounds a thread that never ends.
		task := "/proc/self/task/" + strconv.Itoa(tid)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("thread %d that ran fn is still alive, in netns %d (the pod's: %d)", tid, ino(task+"/ns/net"), ino(pod.Path()))
			}
		}
	}
}

// Sysfs shows the pod's netdevs and no others, leaves the caller's /sys
// alone, and is read-only; WritableSysfs lets fn change a setting of the
// pod's (lo's MTU here, as roceqos sets a traffic class), also while a
// read-only one is mounted.
func TestSysfsShowsThePodsOwn(t *testing.T) {
	pod := newNetns(t, "podns-s")
	hostNet := podnstest.Netdevs(t, "/sys")
	read := func() (names []string, mtu string) {
		t.Helper()
		err := Do(pod.Path(), func(th Thread) error {
			names = podnstest.Netdevs(t, th.Sysfs)
			b, err := os.ReadFile(filepath.Join(th.Sysfs, "class/net/lo/mtu"))
			mtu = strings.TrimSpace(string(b))
			return err
		}, Sysfs())
		if err != nil {
			t.Fatal(err)
		}
		return names, mtu
	}
	names, mtu := read()
	if want := []string{"lo", "podns-s", "podns-s-p"}; !slices.Equal(names, want) {
		t.Fatalf("class/net in the pod = %v, want %v", names, want)
	}
	if got := podnstest.Netdevs(t, "/sys"); !slices.Equal(got, hostNet) {
		t.Fatalf("the caller's /sys/class/net changed: %v -> %v", hostNet, got)
	}
	newMTU := "1280"
	if mtu == newMTU {
		newMTU = "1500"
	}
	write := func(opt Option) error {
		return Do(pod.Path(), func(th Thread) error {
			return os.WriteFile(filepath.Join(th.Sysfs, "class/net/lo/mtu"), []byte(newMTU), 0o644)
		}, opt)
	}
	if err := write(Sysfs()); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing through Sysfs: %v, want %v", err, unix.EROFS)
	}
	// While a read-only sysfs of the pod is mounted (Sysfs), as when the
	// doctor reads the pod while the CNI plugin sets a traffic class.
	err := Do(pod.Path(), func(Thread) error { return write(WritableSysfs()) }, Sysfs())
	if err != nil {
		t.Fatalf("writing through WritableSysfs while a read-only one is mounted: %v", err)
	}
	if _, got := read(); got != newMTU {
		t.Errorf("the pod's lo has MTU %s after writing %s", got, newMTU)
	}
}

// A sysfs needs a thread that is thrown away, which the caller's cannot
// be: Do refuses before fn runs.
func TestCallerThreadRefusesToBeDiscarded(t *testing.T) {
	pod := newNetns(t, "podns-r")
	for _, opt := range []Option{Discard(), Sysfs(), WritableSysfs()} {
		ran := false
		if err := Do(pod.Path(), func(Thread) error { ran = true; return nil }, CallerThread(), opt); err == nil || ran {
			t.Errorf("Do on the caller's thread with a thread to throw away: err %v, fn ran: %v", err, ran)
		}
	}
}

// A path that is no netns fails in every variant, naming the path, and
// fn does not run.
func TestNotANetns(t *testing.T) {
	needRoot(t)
	file := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/nonexistent/netns", file} {
		for name, opts := range map[string][]Option{"caller": {CallerThread()}, "new": nil, "discard": {Discard()}, "sysfs": {Sysfs()}} {
			ran := false
			err := Do(path, func(Thread) error { ran = true; return nil }, opts...)
			if err == nil || !strings.Contains(err.Error(), path) || ran {
				t.Errorf("Do(%s) %s: err %v, fn ran: %v", path, name, err, ran)
			}
		}
	}
}

const (
	helperEnv      = "PODNS_TEST_ON_MAIN_THREAD"
	helperNetnsEnv = "PODNS_TEST_NETNS"
)

// A new thread is never the main thread, whose netns is the process's own
// in /proc/self/ns/net: that stays the host's while fn runs and after Do,
// also for a thread thrown away. Each variant runs in a process of its
// own whose main goroutine leaves the main thread free for Do's goroutine,
// as in the CNI plugin.
func TestNeverOnTheMainThread(t *testing.T) {
	pod := newNetns(t, "podns-m")
	for _, variant := range []string{"new", "discard", "sysfs"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+variant, helperNetnsEnv+"="+pod.Path())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("%s: %v: %s", variant, err, out.String())
		}
	}
}

// onMainThread is TestNeverOnTheMainThread's helper process. With one P
// and the main goroutine unlocked on the main thread, the goroutine Do
// starts runs on the main thread when the main goroutine blocks.
func onMainThread(variant, nsPath string) int {
	opts := map[string][]Option{"new": nil, "discard": {Discard()}, "sysfs": {Sysfs()}}[variant]
	own := func() uint64 { return ino("/proc/self/ns/net") }
	host := own()
	runtime.GOMAXPROCS(1)
	runtime.UnlockOSThread()
	var during uint64
	err := Do(nsPath, func(Thread) error { during = own(); return nil }, opts...)
	after := own()
	if err != nil || during != host || after != host {
		fmt.Fprintf(os.Stderr, "Do: %v; the process's netns (/proc/self/ns/net) is %d while fn runs and %d after, want the host's %d\n", err, during, after, host)
		return 1
	}
	return 0
}
