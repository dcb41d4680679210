package rdmans

import (
	"errors"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

func TestModeOfParam(t *testing.T) {
	for in, want := range map[string]string{"Y\n": ModeShared, "N\n": ModeExclusive, "N": ModeExclusive, "1\n": "", "": ""} {
		if got := modeOfParam([]byte(in)); got != want {
			t.Errorf("modeOfParam(%q) = %q, want %q", in, got, want)
		}
	}
}

// visit runs fn in the pod's netns and always brings the thread back,
// also when fn fails: what follows must talk to the host again.
func TestVisitReturnsToTheHost(t *testing.T) {
	p := newPodNS(t)
	// Held across the visits, so the checks below look at the thread
	// visit used (LockOSThread nests).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	pod, err := netns.GetFromPath(p.ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	boom := errors.New("boom")
	for _, ret := range []error{nil, boom} {
		err := visit(p.ns.Path(), func(from netns.NsHandle) error {
			in, err := netns.Get()
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			if !in.Equal(pod) {
				t.Errorf("fn runs in %s, want the pod's netns %s", in, pod)
			}
			if !from.Equal(host) {
				t.Errorf("fn is handed %s as the netns it came from, want %s", from, host)
			}
			return ret
		})
		if !errors.Is(err, ret) || (ret == nil && err != nil) {
			t.Errorf("visit returned %v, want %v", err, ret)
		}
		now, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		if !now.Equal(host) {
			t.Errorf("after visit (fn returning %v) the thread is in %s, want the host's %s", ret, now, host)
		}
		now.Close()
	}
	if err := visit("/nonexistent/netns", func(netns.NsHandle) error { return nil }); err == nil {
		t.Error("visit of a missing netns path succeeded")
	}
}
