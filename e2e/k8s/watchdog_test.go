//go:build e2e

package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// watchdogMargin is how long before vm-run.sh's timeout the watchdog ends
// the run: enough to print and for the VM to go off by itself.
const watchdogMargin = time.Minute

// startWatchdog ends the run watchdogMargin before vm-run.sh's timeout
// (limit, counted from the guest kernel's start) would kill the VM, after
// printing every goroutine's stack and the tails of kubelet's and
// containerd's logs. A hung run (a wait with no deadline, a call that
// never returns) then says where it hung instead of only "no exit after
// 1200s". No limit (outside vm-run.sh): no watchdog.
func startWatchdog(limit time.Duration) {
	left := limit - uptime() - watchdogMargin
	if limit <= 0 || left <= 0 {
		return
	}
	time.AfterFunc(left, func() {
		buf := make([]byte, 16<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "\nk8s.test: watchdog: still running %s before vm-run.sh's timeout (%s); ending the run. Every goroutine:\n%s\n",
			watchdogMargin, limit, buf)
		for _, f := range []string{filepath.Join(node.Dir, "kubelet.log"), "/var/log/containerd.log"} {
			fmt.Fprintf(os.Stderr, "k8s.test: watchdog: the last lines of %s:\n%s\n", f, node.Tail(f, 40))
		}
		os.Exit(3)
	})
}

// uptime is how long ago the guest's kernel started (/proc/uptime), 0 if
// unreadable.
func uptime() time.Duration {
	data, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	s, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}
