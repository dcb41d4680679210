package rdmans

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// visit runs fn with the calling goroutine's thread inside the netns at
// nsPath, then brings the thread back; fn gets a handle on the netns it
// came from. pkg/ns does the same on a new goroutine, which in a freshly
// started plugin also means a new thread: measured in the test VM, its
// first visit took 2.4 ms against 1.0 ms for this, once per ADD and DEL.
//
// A thread that cannot return would leave everything after it talking to
// the pod's netns, so that is the one failure that stops the process.
func visit(nsPath string, fn func(from netns.NsHandle) error) error {
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("failed to open netns %s: %v", nsPath, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	from, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("failed to open the current netns: %v", err)
	}
	defer from.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("failed to enter netns %s: %v", nsPath, err)
	}
	ferr := fn(from)
	if err := netns.Set(from); err != nil {
		panic(fmt.Sprintf("rdma-netns: cannot return from netns %s to its own netns: %v", nsPath, err))
	}
	runtime.UnlockOSThread()
	return ferr
}
