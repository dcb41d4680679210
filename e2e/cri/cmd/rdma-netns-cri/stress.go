package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// killPoints are where a stress round kills containerd: while one plugin of
// the chain holds its ADD, or after a random delay into RunPodSandbox
// (before the ADDs, between them, after them, or once the pod runs).
var killPoints = []string{"host-device ADD", "static ADD", "rdma-netns ADD", "delay"}

// stress kills containerd in the middle of RunPodSandbox, round after
// round, restarts it, and stops and removes what it lists, as kubelet
// would; after each round every RDMA device must be back on the host and
// no pod netns left. At the end one pod per network shows that what the
// kills left (stale records) blocks nothing, and no record remains.
func stress(args []string) error {
	fs := flag.NewFlagSet("stress", flag.ExitOnError)
	rounds := fs.Int("rounds", 12, "kills of containerd")
	seed := fs.Int64("seed", time.Now().UnixNano(), "random seed (printed; reproduces a run's choices)")
	maxDelay := fs.Duration("max-delay", 2500*time.Millisecond, "longest delay into RunPodSandbox for the delay kill point")
	fs.Parse(args)
	rnd := rand.New(rand.NewSource(*seed))
	fmt.Printf("CRI stress: %d rounds, seed %d\n", *rounds, *seed)

	if err := cririg.Setup(); err != nil {
		return err
	}
	bin, err := cririg.TraceCNI()
	if err != nil {
		return err
	}
	ctd, err := cririg.Start(cririg.Options{CNIBinDir: bin})
	if err != nil {
		return err
	}
	defer func() { ctd.Stop() }()
	handlers, err := cririg.Handlers()
	if err != nil {
		return err
	}
	handlers = append([]string{""}, handlers...)
	nics, err := rig.Layout()
	if err != nil {
		return err
	}

	tally := map[string]int{}
	var failures []string
	for r := 1; r <= *rounds; r++ {
		h := handlers[rnd.Intn(len(handlers))]
		point := killPoints[rnd.Intn(len(killPoints))]
		delay := time.Duration(rnd.Int63n(int64(*maxDelay)))
		var res roundResult
		ctd, res, err = killRound(ctd, r, h, point, delay)
		tally[point]++
		if res.listed {
			tally["sandboxes listed after the restart"]++
		}
		tally[fmt.Sprintf("rdma-netns DELs for the sandbox: %d", res.dels)]++
		tally[fmt.Sprintf("plugins dead of SIGPIPE: %d", res.sigpipe)]++
		status := "ok"
		if err != nil {
			status = "FAILED: " + err.Error()
			failures = append(failures, fmt.Sprintf("round %d: %v", r, err))
		}
		fmt.Printf("round %2d: handler %-10q kill at %-16s %-8s RunPodSandbox: %-28s listed %-5v DELs %d: %s\n",
			r, h, point, delayStr(point, delay), res.runErr, res.listed, res.dels, status)
		if ctd == nil {
			break
		}
	}
	if ctd != nil {
		if err := finalPods(ctd, handlers, nics); err != nil {
			failures = append(failures, "after the rounds: "+err.Error())
		}
	}

	keys := make([]string, 0, len(tally))
	for k := range tally {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Println("=== CRI stress summary ===")
	for _, k := range keys {
		fmt.Printf("  %-40s %d\n", k, tally[k])
	}
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Println("  FAILURE", f)
		}
		return fmt.Errorf("%d failures (seed %d)", len(failures), *seed)
	}
	fmt.Printf("CRI stress: %d kills of containerd in RunPodSandbox, every device back, no record left (seed %d)\n", *rounds, *seed)
	return nil
}

func delayStr(point string, d time.Duration) string {
	if point != "delay" {
		return ""
	}
	return d.Round(time.Millisecond).String()
}

type roundResult struct {
	runErr  string // what RunPodSandbox returned, shortened
	listed  bool   // the restarted containerd listed the sandbox
	dels    int    // rdma-netns DELs containerd made for it after the restart
	sigpipe int    // plugins killed by SIGPIPE after containerd died
}

// killRound runs one pod on handler h, kills containerd at point, restarts
// it, cleans up and checks; it returns the containerd running afterwards.
func killRound(ctd *cririg.Containerd, round int, h, point string, delay time.Duration) (*cririg.Containerd, roundResult, error) {
	var res roundResult
	if err := cririg.ResetCalls(); err != nil {
		return ctd, res, err
	}
	var plugin string
	if point != "delay" {
		plugin = point[:len(point)-len(" ADD")]
		if err := cririg.Hold(plugin, "ADD"); err != nil {
			return ctd, res, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		_, err := ctd.RunPod(ctx, cririg.PodSpec{Name: fmt.Sprintf("stress-%d", round), Namespace: "stress", Handler: h})
		runErr <- err
	}()
	if plugin != "" {
		if _, err := cririg.WaitHeld(plugin, "ADD", time.Minute); err != nil {
			cririg.Release(plugin, "ADD")
			return ctd, res, err
		}
	} else {
		time.Sleep(delay)
	}
	if err := ctd.Kill(); err != nil {
		return ctd, res, err
	}
	if err := <-runErr; err != nil {
		res.runErr = "failed"
	} else {
		res.runErr = "returned before the kill"
	}
	if plugin != "" {
		if err := cririg.Release(plugin, "ADD"); err != nil {
			return ctd, res, err
		}
	}
	// A node's containerd comes back after the plugins it left running
	// ended (systemd's restart delay); the test waits for them likewise.
	_, pipes, err := cririg.WaitCallsDone(30 * time.Second)
	res.sigpipe = pipes
	if err != nil {
		return ctd, res, err
	}
	ctd, err = cririg.Start(ctd.Opts)
	if err != nil {
		return nil, res, err
	}
	pods, err := ctd.Pods(ctx)
	if err != nil {
		return ctd, res, err
	}
	res.listed = len(pods) > 0
	if err := ctd.Cleanup(ctx); err != nil {
		return ctd, res, err
	}
	calls, err := cririg.Calls()
	if err != nil {
		return ctd, res, err
	}
	for _, c := range calls {
		if c.Plugin == "rdma-netns" && c.Command == "DEL" {
			res.dels++
		}
	}
	return ctd, res, home(10 * time.Second)
}

// home checks every NIC is back on the host, its RDMA device and its
// netdev (renamed back: a netns destroyed without host-device's DEL returns
// the NIC under a name of the kernel's), and no pod netns is left.
func home(timeout time.Duration) error {
	nics, err := rig.Layout()
	if err != nil {
		return err
	}
	missing, err := rig.WaitHome(nics, timeout)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("not back on the host: %v", missing)
	}
	left, err := filepath.Glob("/run/netns/cni-*")
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("pod netns left: %v", left)
	}
	return nil
}

// finalPods runs, stops and removes one pod per network: stale records of
// the killed rounds must not block them, and none may be left after.
func finalPods(ctd *cririg.Containerd, handlers []string, nics []rig.NIC) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fmt.Printf("records before the final pods (stale ones from the kills): %d\n", len(rig.Records(cririg.RecordsDir)))
	var errs []error
	for _, h := range handlers {
		p, err := ctd.RunPod(ctx, cririg.PodSpec{Name: "final", Namespace: "stress", Handler: h})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := ctd.StopPod(ctx, p.ID); err != nil {
			errs = append(errs, err)
		}
		if err := ctd.RemovePod(ctx, p.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := home(10 * time.Second); err != nil {
		errs = append(errs, err)
	}
	if recs := rig.Records(cririg.RecordsDir); len(recs) > 0 {
		errs = append(errs, fmt.Errorf("records left after the final pods: %v", recs))
	}
	return errors.Join(errs...)
}
