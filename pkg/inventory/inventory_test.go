package inventory

import (
	"errors"
	"os"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// fakeIDs resolves netns paths from a table; missing paths do not exist.
func fakeIDs(ids map[string]NetnsID) func(string) (NetnsID, error) {
	return func(p string) (NetnsID, error) {
		if id, ok := ids[p]; ok {
			return id, nil
		}
		return NetnsID{}, errors.New("no such file")
	}
}

func rec(cid, netns string, ino uint64, dev, podName string) *state.Record {
	return &state.Record{Key: state.Key{Network: "n", ContainerID: cid, IfName: "net1"}, Netns: netns, NetnsDev: 4, NetnsIno: ino, Device: dev, PodName: podName}
}

func TestJudge(t *testing.T) {
	podA := &Namespace{Path: "/run/netns/a", ID: NetnsID{Dev: 4, Ino: 100}, Devices: []string{"rxe1", "roce0"}}
	reused := &Namespace{Path: "/proc/77/ns/net", ID: NetnsID{Dev: 4, Ino: 300}, Devices: []string{"rxe3"}}
	s := &Snapshot{Host: []string{"rxe2", "roce9"}, Namespaces: []*Namespace{podA, reused}}
	ids := fakeIDs(map[string]NetnsID{"/run/netns/a": podA.ID, "/proc/77/ns/net": reused.ID, "/run/netns/empty": {Dev: 4, Ino: 200}})
	for _, tc := range []struct {
		name  string
		rec   *state.Record
		want  Verdict
		where *Namespace
	}{
		{"held", rec("a", "/run/netns/a", 100, "rxe1", ""), Held, podA},
		{"held renamed", rec("a", "/run/netns/a", 100, "mlx5_0", "roce0"), Held, podA},
		{"held under host name after an interrupted rename", rec("a", "/run/netns/a", 100, "rxe1", "rdma_x"), Held, podA},
		{"record without identity", rec("a", "/run/netns/a", 0, "rxe1", ""), Held, podA},
		{"device back in the host", rec("b", "/run/netns/empty", 200, "rxe2", ""), Returned, nil},
		{"renamed device back in the host", rec("b", "/run/netns/empty", 200, "mlx5_9", "roce9"), Returned, nil},
		{"netns gone, device home", rec("c", "/run/netns/gone", 500, "rxe2", ""), NetnsGone, nil},
		{"netns gone, device not back yet", rec("c", "/run/netns/gone", 500, "rxe7", ""), NetnsGone, nil},
		{"path reused by another netns", rec("d", "/proc/77/ns/net", 250, "rxe3", ""), NetnsGone, reused},
		{"moved elsewhere", rec("e", "/run/netns/empty", 200, "rxe3", ""), Elsewhere, reused},
		{"vanished", rec("f", "/run/netns/a", 100, "rxe8", ""), Missing, nil},
	} {
		got, where := s.Judge(tc.rec, ids)
		if got != tc.want || where != tc.where {
			t.Errorf("%s: Judge = %s, %v; want %s, %v", tc.name, got, where, tc.want, tc.where)
		}
		if got.Stale() != (tc.want == Returned || tc.want == NetnsGone) {
			t.Errorf("%s: Stale() = %v", tc.name, got.Stale())
		}
	}
}

func TestPlacements(t *testing.T) {
	podA := &Namespace{Path: "/run/netns/a", ID: NetnsID{Dev: 4, Ino: 100}, Devices: []string{"roce0", "rxe5"}}
	s := &Snapshot{Host: []string{"rxe2"}, Namespaces: []*Namespace{podA}}
	ids := fakeIDs(map[string]NetnsID{"/run/netns/a": podA.ID})
	held := rec("a", "/run/netns/a", 100, "mlx5_0", "roce0")
	stale := rec("b", "/run/netns/a", 100, "rxe2", "")
	got := s.Placements([]*state.Record{held, stale}, ids)
	if len(got) != 3 {
		t.Fatalf("placements = %+v", got)
	}
	if got[0].Device != "rxe2" || got[0].Netns != nil || got[0].Record != nil {
		t.Errorf("host device: %+v (a stale record must not own it)", got[0])
	}
	if got[1].Device != "roce0" || got[1].Netns != podA || got[1].Record != held {
		t.Errorf("held device: %+v", got[1])
	}
	if got[2].Device != "rxe5" || got[2].Record != nil {
		t.Errorf("unrecorded device in a pod: %+v", got[2])
	}
}

// fakeKernel lists devices per netns path.
type fakeKernel map[string][]string

func (k fakeKernel) DevicesIn(p string) ([]string, error) {
	if d, ok := k[p]; ok {
		return d, nil
	}
	return nil, errors.New("cannot enter")
}

func TestScanFindsEachNetnsOnce(t *testing.T) {
	proc := t.TempDir()
	for _, pid := range []string{"5", "6", "7"} {
		mkdir(t, proc+"/"+pid)
	}
	ids := map[string]NetnsID{
		proc + "/self/ns/net": {Ino: 1},
		"/rec/a":              {Ino: 10}, // the path a record names
		proc + "/5/ns/net":    {Ino: 10}, // a process in the same netns
		proc + "/6/ns/net":    {Ino: 11}, // a netns without devices
		proc + "/7/ns/net":    {Ino: 1},  // a host process
	}
	k := fakeKernel{"": {"rxe0"}, "/rec/a": {"rxe1"}, proc + "/6/ns/net": {}}
	n := &Node{Kernel: k, ProcRoot: proc, Identify: fakeIDs(ids)}
	s, err := n.Scan([]*state.Record{rec("a", "/rec/a", 10, "rxe1", "")})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Host) != 1 || len(s.Namespaces) != 1 || s.Namespaces[0].Path != "/rec/a" {
		t.Fatalf("snapshot = %+v, namespaces %+v", s, s.Namespaces)
	}
	if ns, host := s.Where("rxe1"); host || ns == nil || ns.ID.Ino != 10 {
		t.Fatalf("Where(rxe1) = %v, %v", ns, host)
	}
	if ns, host := s.Where("rxe0"); !host || ns != nil {
		t.Fatalf("Where(rxe0) = %v, %v", ns, host)
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
