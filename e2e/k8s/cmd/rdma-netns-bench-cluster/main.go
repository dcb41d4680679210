// Command rdma-netns-bench-cluster is make bench-cluster (issue 66): the
// scheduler placing pods of conf's claim templates on N kubelet-less
// nodes of 8 GPUs and 8 NICs, against a GPU-only control, and N
// rdma-netns-dra publishers' API traffic at rest (package benchcluster).
// Its tables go between === BENCH CLUSTER BEGIN/END === markers, its
// plots between === PLOT ... === ones, for the Makefile to file.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/k8s/benchcluster"
)

func main() {
	cfg := benchcluster.Config{Out: os.Stdout}
	var sizes, templates string
	flag.StringVar(&cfg.BinDir, "bin-dir", "", "kube-apiserver, kube-scheduler, kube-controller-manager and etcd (scripts/k8s/build.sh --print-env's K8S_BIN_DIR)")
	flag.StringVar(&cfg.Dir, "dir", "_output/bench-cluster", "state directory (emptied per size)")
	flag.StringVar(&cfg.ConfDir, "conf", "conf", "conf/ with the claim templates and the DeviceClass as shipped")
	flag.IntVar(&cfg.APIServerPort, "apiserver-port", 17443, "the bench's API server port on 127.0.0.1 (not the e2e suite's)")
	flag.IntVar(&cfg.EtcdPort, "etcd-port", 13379, "etcd's client port; the peer port is the next")
	flag.IntVar(&cfg.KubeletPort, "kubelet-port", 17250, "checked free on 127.0.0.1 by the control plane runner; no kubelet uses it")
	flag.StringVar(&sizes, "nodes", "100,500", "comma-separated node counts (1000 adds some 25 minutes on 2 cores)")
	flag.StringVar(&templates, "templates", "", "comma-separated templates to run (default all: the GPU-only control always runs)")
	flag.IntVar(&cfg.InFlight, "in-flight", 20, "pods created and not yet scheduled, at most")
	flag.DurationVar(&cfg.Steady, "steady", time.Minute, "the publishers' steady state with no NIC change (the issue's figure: 30m)")
	flag.DurationVar(&cfg.Rescan, "rescan", 30*time.Second, "the publishers' rescan interval (rdma-netns-dra --rescan)")
	flag.DurationVar(&cfg.Stall, "stall", 3*time.Minute, "fail a phase when no pod was scheduled for that long")
	flag.Parse()
	if err := configure(&cfg, sizes, templates); err != nil {
		fmt.Fprintf(os.Stderr, "rdma-netns-bench-cluster: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	results, drivers, err := benchcluster.Run(ctx, cfg)
	fmt.Println("=== BENCH CLUSTER BEGIN ===")
	fmt.Printf("%s, %s: nodes %s, in flight %d, steady %v, rescan %v; took %v\n\n", time.Now().UTC().Format("2006-01-02"), machine(),
		sizes, cfg.InFlight, cfg.Steady, cfg.Rescan, time.Since(start).Round(time.Second))
	benchcluster.WriteTables(os.Stdout, results, drivers)
	fmt.Println("=== BENCH CLUSTER END ===")
	if len(results) > 0 {
		for _, p := range benchcluster.Plots(results, cfg.Sizes) {
			p.Emit()
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdma-netns-bench-cluster: %v\n", err)
		os.Exit(1)
	}
}

func configure(cfg *benchcluster.Config, sizes, templates string) error {
	if cfg.BinDir == "" {
		return fmt.Errorf("no -bin-dir: make bench-cluster passes scripts/k8s/build.sh's")
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-nodes %q: want positive node counts separated by commas", sizes)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	want := map[string]bool{}
	for _, t := range strings.Split(templates, ",") {
		if t = strings.TrimSpace(t); t != "" {
			want[t] = true
		}
	}
	for _, t := range benchcluster.Templates {
		if len(want) == 0 || want[t.Name] || t.Control {
			cfg.Templates = append(cfg.Templates, t)
			delete(want, t.Name)
		}
	}
	for t := range want {
		return fmt.Errorf("-templates: no template %q (have gpu-only-4, gpu-nic-pairs-4, rdma-rails-4, rdma-nics-2)", t)
	}
	if cfg.Rescan <= 0 || cfg.Steady < 0 || cfg.InFlight < 1 {
		return fmt.Errorf("-rescan, -steady and -in-flight: want positive values")
	}
	return nil
}

// machine says what ran the bench, once per table.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	var load string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return fmt.Sprintf("%d CPUs (%s), load %s at the end", numCPU(), model, load)
}

func numCPU() int { return runtime.NumCPU() }
