package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// plainHandler is a runtime handler the bench adds: the same NIC and
// address as benchHandler's network, with host-device alone.
const (
	benchHandler = "rdma-eth1"
	plainHandler = "bench-plain"
	plainDir     = cririg.Dir + "/bench-plain.d"
	floorBin     = "/usr/local/bin/rdma-netns-floor"
)

// bench times what a pod start and stop cost under containerd with
// host-device alone and with host-device + rdma-netns, on the same NIC,
// interleaved in one run, next to the kernel's own cost of moving the RDMA
// device (rdma-netns-floor, e2e/bench/floor). Figures only: the VM
// emulates its CPU, so what counts is the difference and the share.
func bench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	rounds := fs.Int("rounds", 15, "pods of each kind, interleaved")
	attachments := fs.String("attachments", "1,2,4,8", "curve 2: RDMA attachments of one pod (NICs eth10 on; none to skip)")
	// A pod's start and stop under containerd spread by seconds in the
	// emulated VM, far more than rdma-netns's part: enough rounds that the
	// median of the per-round differences means something.
	attachRounds := fs.Int("attach-rounds", 9, "curve 2: interleaved rounds")
	fs.Parse(args)
	nics, err := rig.Layout()
	if err != nil {
		return err
	}
	var counts []int
	for _, f := range strings.Split(*attachments, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			if multiFirstNIC+n > len(nics) {
				fmt.Printf("curve 2: %d attachments skipped, the VM has %d NICs (boot it with --nics %d)\n", n, len(nics), multiFirstNIC+n)
				continue
			}
			counts = append(counts, n)
		}
	}

	if err := cririg.Setup(); err != nil {
		return err
	}
	rdmaNet, err := cririg.NetworkOf(benchHandler)
	if err != nil {
		return err
	}
	if err := writePlainNetwork(); err != nil {
		return err
	}
	multi, err := multiNetworks(counts, nics)
	if err != nil {
		return err
	}
	ctd, err := cririg.Start(cririg.Options{Extra: fmt.Sprintf(`[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s]
  runtime_type = 'io.containerd.runc.v2'
  cni_conf_dir = %[2]q
  cni_max_conf_num = 1
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s.options]
  NoPivotRoot = true
%[3]s`, plainHandler, plainDir, multi)})
	if err != nil {
		return err
	}
	defer ctd.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	type times struct{ run, stop, remove, total []time.Duration }
	var plain, withRDMA times
	var floor []time.Duration
	measure := func(handler string, into *times, i int) error {
		t0 := time.Now()
		p, err := ctd.RunPod(ctx, cririg.PodSpec{Name: fmt.Sprintf("bench-%d", i), Namespace: "bench", Handler: handler})
		if err != nil {
			return err
		}
		t1 := time.Now()
		if err := ctd.StopPod(ctx, p.ID); err != nil {
			return err
		}
		t2 := time.Now()
		if err := ctd.RemovePod(ctx, p.ID); err != nil {
			return err
		}
		t3 := time.Now()
		into.run = append(into.run, t1.Sub(t0))
		into.stop = append(into.stop, t2.Sub(t1))
		into.remove = append(into.remove, t3.Sub(t2))
		into.total = append(into.total, t3.Sub(t0))
		return nil
	}
	// One pod of each kind first, untimed: the first start pays for
	// loading the images' snapshots and the plugins' pages.
	if err := measure(plainHandler, &times{}, -1); err != nil {
		return err
	}
	if err := measure(benchHandler, &times{}, -2); err != nil {
		return err
	}
	for i := 0; i < *rounds; i++ {
		first, second := plainHandler, benchHandler
		a, b := &plain, &withRDMA
		if i%2 == 1 {
			first, second, a, b = second, first, b, a
		}
		if err := measure(first, a, i); err != nil {
			return err
		}
		if err := measure(second, b, i); err != nil {
			return err
		}
		d, err := floorMove(rdmaNet.RDMA)
		if err != nil {
			return err
		}
		floor = append(floor, d)
	}

	ms := func(ds []time.Duration) (string, time.Duration) {
		s := rig.Summarize(ds)
		return fmt.Sprintf("%s / %s", rig.Ms(s.Median), rig.Ms(s.P95)), s.Median
	}
	fmt.Println("=== CRI BENCH BEGIN ===")
	fmt.Printf("containerd over CRI, %d pods of each kind interleaved, NIC %s (%s); ms, median / p95\n", *rounds, rdmaNet.Netdev, rdmaNet.RDMA)
	w := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(w, "CRI call\thost-device\thost-device + rdma-netns\tdifference of medians\tmedian of round differences\tshare (of medians)")
	for _, r := range []struct {
		name   string
		pl, rd []time.Duration
	}{
		{"RunPodSandbox", plain.run, withRDMA.run},
		{"StopPodSandbox", plain.stop, withRDMA.stop},
		{"RemovePodSandbox", plain.remove, withRDMA.remove},
		{"all three", plain.total, withRDMA.total},
	} {
		ps, pm := ms(r.pl)
		rs, rm := ms(r.rd)
		var diffs []time.Duration
		for i := range r.rd {
			diffs = append(diffs, r.rd[i]-r.pl[i])
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%.0f%%\n", r.name, ps, rs, rig.Ms(rm-pm), rig.Ms(rig.Summarize(diffs).Median), 100*float64(rm-pm)/float64(rm))
	}
	w.Flush()
	fs2, _ := ms(floor)
	fmt.Printf("kernel floor: %s moved into a netns and back by two rdma-netns-floor processes: %s\n", rdmaNet.RDMA, fs2)
	fmt.Println("=== CRI BENCH END ===")
	if len(counts) == 0 {
		return nil
	}
	return attachmentsCurve(ctx, ctd, counts, *attachRounds)
}

// writePlainNetwork writes benchHandler's conflist without rdma-netns, as
// the bench-plain handler's network.
func writePlainNetwork() error {
	files, err := filepath.Glob("/etc/cni/" + benchHandler + ".d/*.conflist")
	if err != nil || len(files) != 1 {
		return fmt.Errorf("want one conflist for %s, found %v (%v)", benchHandler, files, err)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		return err
	}
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		return err
	}
	plugins, _ := conf["plugins"].([]any)
	var kept []any
	for _, p := range plugins {
		if m, _ := p.(map[string]any); m["type"] != "rdma-netns" {
			kept = append(kept, p)
		}
	}
	conf["plugins"] = kept
	conf["name"] = plainHandler
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(plainDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(plainDir, plainHandler+".conflist"), out, 0o644)
}

// floorMove times the kernel floor: rdma-netns-floor moving dev into a
// fresh netns and back, as processes, like a plugin's ADD and DEL.
func floorMove(dev string) (time.Duration, error) {
	pod, err := rig.NewPod()
	if err != nil {
		return 0, err
	}
	defer pod.Destroy()
	t0 := time.Now()
	for _, mode := range []string{"in", "out"} {
		if out, err := exec.Command(floorBin, mode, dev, pod.Path()).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%s %s %s: %v: %s", floorBin, mode, dev, err, out)
		}
	}
	return time.Since(t0), nil
}
