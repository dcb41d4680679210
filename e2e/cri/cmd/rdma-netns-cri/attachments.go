package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/plot"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// multiFirstNIC is the first NIC of the multi-attachment pods: the NICs
// before it belong to the handlers of conf/containerd and the other tests.
const multiFirstNIC = 10

// multiHandler names the runtime handler whose pods get n networks, each a
// NIC of its own, with rdma-netns in each chain or without it.
func multiHandler(n int, withRDMA bool) string {
	if withRDMA {
		return fmt.Sprintf("bench-multi%d", n)
	}
	return fmt.Sprintf("bench-multi%d-plain", n)
}

// multiNetworks writes, for every count, the conf dirs of the two
// handlers: n conflists, host-device of one NIC with a static address of
// its own subnet (plus rdma-netns), which containerd attaches in name
// order (cni_max_conf_num = n), as it does for a pod with several
// networks. It returns the TOML of the handlers.
func multiNetworks(counts []int, nics []rig.NIC) (string, error) {
	var toml strings.Builder
	for _, n := range counts {
		for _, withRDMA := range []bool{true, false} {
			h := multiHandler(n, withRDMA)
			dir := filepath.Join(cririg.Dir, h+".d")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", err
			}
			for k := 0; k < n; k++ {
				nic := nics[multiFirstNIC+k]
				plugins := []any{map[string]any{"type": "host-device", "device": nic.Netdev,
					"ipam": map[string]any{"type": "static", "addresses": []any{map[string]any{"address": fmt.Sprintf("10.100.%d.1/24", 210+k)}}}}}
				if withRDMA {
					plugins = append(plugins, map[string]any{"type": "rdma-netns"})
				}
				conf := map[string]any{"cniVersion": "1.1.0", "name": fmt.Sprintf("%s-net%d", h, k), "plugins": plugins}
				data, err := json.MarshalIndent(conf, "", "  ")
				if err != nil {
					return "", err
				}
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-net.conflist", k)), data, 0o644); err != nil {
					return "", err
				}
			}
			fmt.Fprintf(&toml, `[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s]
  runtime_type = 'io.containerd.runc.v2'
  cni_conf_dir = %[2]q
  cni_max_conf_num = %[3]d
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s.options]
  NoPivotRoot = true
`, h, dir, n)
		}
	}
	return toml.String(), nil
}

// attachmentsCurve is curve 2: one pod with 1, 2, 4, 8 RDMA attachments,
// RunPodSandbox+StopPodSandbox+RemovePodSandbox with and without rdma-netns
// in every chain, interleaved; what rdma-netns adds per attachment should
// not grow with their count.
func attachmentsCurve(ctx context.Context, ctd *cririg.Containerd, counts []int, rounds int) error {
	type point struct{ with, plain []time.Duration }
	points := map[int]*point{}
	run := func(handler string, i int) (time.Duration, error) {
		t0 := time.Now()
		p, err := ctd.RunPod(ctx, cririg.PodSpec{Name: fmt.Sprintf("multi-%d", i), Namespace: "bench", Handler: handler})
		if err != nil {
			return 0, fmt.Errorf("%s: %v", handler, err)
		}
		if err := ctd.StopPod(ctx, p.ID); err != nil {
			return 0, err
		}
		if err := ctd.RemovePod(ctx, p.ID); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	for _, n := range counts {
		points[n] = &point{}
	}
	for r := -1; r < rounds; r++ { // round -1 warms up
		for j, n := range counts {
			order := []bool{true, false}
			if (r+j)%2 == 1 {
				order = []bool{false, true}
			}
			for _, withRDMA := range order {
				d, err := run(multiHandler(n, withRDMA), r)
				if err != nil {
					return err
				}
				if r < 0 {
					continue
				}
				if withRDMA {
					points[n].with = append(points[n].with, d)
				} else {
					points[n].plain = append(points[n].plain, d)
				}
			}
		}
	}
	fmt.Println("=== CRI ATTACHMENTS BEGIN ===")
	fmt.Printf("one pod with N networks (host-device of a NIC each, with and without rdma-netns), RunPodSandbox+StopPodSandbox+RemovePodSandbox, %d rounds interleaved; ms, medians\n", rounds)
	w := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(w, "attachments\thost-device only\twith rdma-netns\trdma-netns per attachment\t(p25-p75 over rounds)\tratio to 1 attachment")
	var xs, per []float64
	var first float64
	for _, n := range counts {
		p := points[n]
		wm, pm := rig.Summarize(p.with).Median, rig.Summarize(p.plain).Median
		var diffs []time.Duration
		for i := range p.with {
			diffs = append(diffs, (p.with[i]-p.plain[i])/time.Duration(n))
		}
		st := rig.Summarize(diffs)
		d := float64(st.Median) / 1e6
		if len(xs) == 0 {
			first = d
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%.2f\t(%s-%s)\t%.2fx\n", n, rig.Ms(pm), rig.Ms(wm), d, rig.Ms(st.P25), rig.Ms(st.P75), d/first)
		xs, per = append(xs, float64(n)), append(per, d)
	}
	w.Flush()
	fmt.Println("rdma-netns per attachment: the median over rounds of (with - without) / N, pods run one after the other")
	fmt.Println("=== CRI ATTACHMENTS END ===")
	(&plot.Plot{Name: "curve2-attachments-per-pod", Title: "Curve 2: one pod with N RDMA attachments (containerd)",
		XLabel: "RDMA attachments in the pod", YLabel: "ms rdma-netns adds per attachment", Xs: xs,
		Series: []plot.Series{{Label: "run+stop+remove, with minus without, / N", Ys: per}}}).Emit()
	return nil
}
