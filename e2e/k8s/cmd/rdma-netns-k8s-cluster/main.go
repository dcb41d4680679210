// rdma-netns-k8s-cluster runs the e2e cluster's control plane on the host's
// loopback (package cluster) for as long as a command runs, typically
// scripts/vm-run.sh booting the node, and exits with the command's status.
// It prints what the control plane cost: its start-up time and the CPU
// time of each component.
//
//	rdma-netns-k8s-cluster -bin-dir DIR -dir DIR -guest-dir DIR -- CMD [ARGS...]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
)

func main() {
	var cfg cluster.Config
	flag.StringVar(&cfg.BinDir, "bin-dir", "", "the cluster's binaries (scripts/k8s/build.sh --print-env: K8S_BIN_DIR)")
	flag.StringVar(&cfg.Dir, "dir", "_output/k8s", "state, certificates, kubeconfigs and logs (emptied first)")
	flag.StringVar(&cfg.GuestDir, "guest-dir", "", "where to write the node's kubeconfigs and CA (part of the VM payload)")
	flag.IntVar(&cfg.APIServerPort, "apiserver-port", 16443, "the API server's port on 127.0.0.1")
	flag.IntVar(&cfg.EtcdPort, "etcd-port", 12379, "etcd's client port on 127.0.0.1 (the peer port is the next)")
	flag.IntVar(&cfg.KubeletPort, "kubelet-port", cluster.DefaultKubeletPort, "kubelet's port, in the guest and forwarded from the host's 127.0.0.N for node N (vm-run.sh --kubelet-port)")
	flag.IntVar(&cfg.Nodes, "nodes", 1, "how many nodes (VMs, vm-run.sh --node 1..N) join: each gets its kubelet identity")
	flag.Parse()
	if cfg.BinDir == "" || cfg.GuestDir == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: rdma-netns-k8s-cluster -bin-dir DIR -guest-dir DIR [-dir DIR] -- CMD [ARGS...]")
		os.Exit(2)
	}
	os.Exit(run(cfg, flag.Args()))
}

func run(cfg cluster.Config, argv []string) int {
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "[k8s-cluster] "+format+"\n", a...) }
	cp, err := cluster.Start(cfg)
	if err != nil {
		logf("control plane: %v", err)
		return 1
	}
	defer cp.Stop()
	logf("control plane ready in %v (API server on 127.0.0.1:%d, logs in %s)", cp.Ready.Round(time.Millisecond), cfg.APIServerPort, cfg.Dir+"/logs")
	idle := cp.CPU()

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Admin)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		logf("%v", err)
		return 1
	}
	go func() {
		s := <-sigs
		_ = cmd.Process.Signal(s)
	}()
	started := time.Now()
	err = cmd.Wait()
	ran := time.Since(started)
	rc := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		rc = ee.ExitCode()
		if rc < 0 {
			rc = 1
		}
	} else if err != nil {
		logf("%v", err)
		rc = 1
	}
	cpu := cp.CPU()
	names := make([]string, 0, len(cpu))
	for n := range cpu {
		names = append(names, n)
	}
	sort.Strings(names)
	var total time.Duration
	for _, n := range names {
		logf("CPU %-24s %7.1fs (%.1fs before the command)", n, cpu[n].Seconds(), idle[n].Seconds())
		total += cpu[n]
	}
	logf("CPU control plane total %.1fs over %v of command", total.Seconds(), ran.Round(time.Second))
	return rc
}
