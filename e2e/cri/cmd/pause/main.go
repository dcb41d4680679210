// Command pause is the pods' sandbox process in the CRI tests: it holds the
// pod's namespaces, reaps the children the pod's PID namespace hands it,
// and exits on SIGTERM or SIGINT, which is all containerd asks of a pause
// image. Built static and packed into rdma-netns.test/pause:1 in the VM
// (cririg.BuildImages).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
