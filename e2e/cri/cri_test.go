//go:build e2e

package cri_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// ctd is the containerd every test drives; tests that kill it store the
// restarted one here.
var ctd *cririg.Containerd

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := cririg.Setup(); err != nil {
		fmt.Fprintln(os.Stderr, "cri setup:", err)
		return 1
	}
	bin, err := cririg.TraceCNI()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni trace:", err)
		return 1
	}
	start := time.Now()
	if ctd, err = cririg.Start(cririg.Options{CNIBinDir: bin}); err != nil {
		fmt.Fprintln(os.Stderr, "containerd:", err)
		return 1
	}
	fmt.Printf("containerd answered CRI after %s; up with images imported after %s\n", ctd.StartTime.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	rc := m.Run()
	if err := ctd.Cleanup(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		rc = 1
	}
	if err := ctd.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop containerd:", err)
	}
	printCalls()
	return rc
}

// printCalls prints how often containerd called each plugin with each
// command over the whole run (the notes on what containerd does).
func printCalls() {
	cririg.PrintCallCounts("CNI calls containerd made during the CRI tests")
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// waitHome waits for the devices to be back in the host netns.
func waitHome(t *testing.T, devs ...string) {
	t.Helper()
	rig.WaitDevicesHome(t, 10*time.Second, devs...)
}

// podHolds checks that the pod's netns holds exactly dev and the host does
// not list it.
func podHolds(t *testing.T, pod *cririg.Pod, dev string) {
	t.Helper()
	in, err := rig.RDMAIn(pod.Netns)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 1 || in[0] != dev {
		t.Fatalf("pod %s (%s) has RDMA devices %v, want [%s]", pod.Spec.Name, pod.Netns, in, dev)
	}
	if rig.HostHas(t, dev) {
		t.Fatalf("the host still lists %s after RunPodSandbox of %s", dev, pod.Spec.Name)
	}
}

// record is the part of an attachment record the tests read.
type record struct {
	Network      string `json:"network"`
	ContainerID  string `json:"containerID"`
	IfName       string `json:"ifName"`
	Device       string `json:"rdmaDevice"`
	K8sNamespace string `json:"k8sNamespace"`
	K8sPod       string `json:"k8sPod"`
}

func records(t *testing.T) []record {
	t.Helper()
	var recs []record
	for _, f := range rig.Records(cririg.RecordsDir) {
		data, err := os.ReadFile(filepath.Join(cririg.RecordsDir, f))
		if err != nil {
			t.Fatal(err)
		}
		var r record
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		recs = append(recs, r)
	}
	return recs
}

func noRecords(t *testing.T) {
	t.Helper()
	if recs := rig.Records(cririg.RecordsDir); len(recs) != 0 {
		t.Fatalf("records left in %s: %v", cririg.RecordsDir, recs)
	}
}

// callsFor are the trace's calls of plugin for the sandbox id.
func callsFor(t *testing.T, plugin, id string) []cririg.Call {
	t.Helper()
	all, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}
	var out []cririg.Call
	for _, c := range all {
		if c.Plugin == plugin && c.ContainerID == id {
			out = append(out, c)
		}
	}
	return out
}

func commands(calls []cririg.Call) string {
	var s []string
	for _, c := range calls {
		x := c.Command
		if c.Command == "DEL" && c.Netns == "" {
			x += "(no netns)"
		}
		s = append(s, x)
	}
	return strings.Join(s, " ")
}

func countCalls(t *testing.T, plugin, command string) int {
	t.Helper()
	all, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range all {
		if c.Plugin == plugin && c.Command == command {
			n++
		}
	}
	return n
}
