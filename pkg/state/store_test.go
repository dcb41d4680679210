package state

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := New(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testRecord(network, cid, ifname, dev string) *Record {
	return &Record{
		Key:    Key{Network: network, ContainerID: cid, IfName: ifname},
		Netns:  "/var/run/netns/cni-" + cid,
		Device: dev,
		State:  StateAttached,
	}
}

func lockT(t *testing.T, s *Store) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err := s.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := unlock(); err != nil {
			t.Error(err)
		}
	}
}

func TestNew(t *testing.T) {
	if _, err := New("relative/dir"); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("New(relative) = %v, want an error about absolute paths", err)
	}

	base := t.TempDir()
	dir := filepath.Join(base, "a", "b")
	s, err := New(dir + "/./")
	if err != nil {
		t.Fatal(err)
	}
	if s.Dir() != dir {
		t.Errorf("Dir() = %q, want %q", s.Dir(), dir)
	}
	assertPerm(t, dir, 0o700)

	// An existing, too-open directory is tightened.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(dir); err != nil {
		t.Fatal(err)
	}
	assertPerm(t, dir, 0o700)

	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(file); err == nil {
		t.Fatal("New on a regular file succeeded")
	}
}

func assertPerm(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s has mode %o, want %o", path, got, want)
	}
}

func TestPutGetDelete(t *testing.T) {
	s := newStore(t)
	r := testRecord("rdma-net", k8sContainerID, "net1", "mlx5_0")
	r.PodName = "rdma0"
	r.DevPath = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2"
	r.PCIAddress = "0000:3b:00.2"
	r.Rule = "pciAddress"
	r.HostNetdev = "ens1f0np0"
	r.NetdevParent = "pci/0000:3b:00.2"

	if _, err := s.Get(r.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get before Put = %v, want ErrNotFound", err)
	}

	unlock := lockT(t, s)
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	unlock()
	if r.Version != SchemaVersion || r.Created.IsZero() {
		t.Errorf("Put did not set Version/Created: %+v", r)
	}

	got, err := s.Get(r.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Created.Equal(r.Created) {
		t.Errorf("Created = %v, want %v", got.Created, r.Created)
	}
	got.Created = r.Created
	if *got != *r {
		t.Errorf("Get = %+v, want %+v", got, r)
	}

	// Exactly the record and the lock file, with private permissions.
	entries, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		assertPerm(t, filepath.Join(s.Dir(), e.Name()), 0o600)
	}
	want := []string{filepath.Base(s.Path(r.Key)), "lock"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("state dir holds %q, want %q", names, want)
	}
	assertPerm(t, s.Dir(), 0o700)

	// Overwrite.
	r.State = StateMoving
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(r.Key); err != nil || got.State != StateMoving {
		t.Fatalf("Get after overwrite = %+v, %v", got, err)
	}

	if err := s.Delete(r.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(r.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
	if err := s.Delete(r.Key); err != nil {
		t.Fatalf("second Delete = %v, want nil", err)
	}
}

func TestPutRejectsInvalid(t *testing.T) {
	s := newStore(t)
	tests := []struct {
		name string
		mod  func(*Record)
	}{
		{"bad key", func(r *Record) { r.ContainerID = "../x" }},
		{"empty device", func(r *Record) { r.Device = "" }},
		{"device with slash", func(r *Record) { r.Device = "../mlx5_0" }},
		{"device too long", func(r *Record) { r.Device = strings.Repeat("m", 64) }},
		{"bad pod name", func(r *Record) { r.PodName = "a/b" }},
		{"bad host netdev", func(r *Record) { r.HostNetdev = "a/b" }},
		{"host netdev too long", func(r *Record) { r.HostNetdev = strings.Repeat("e", 16) }},
		{"control char in netdev parent", func(r *Record) { r.NetdevParent = "pci/\x1b[2J" }},
		{"empty netns", func(r *Record) { r.Netns = "" }},
		{"control char in netns", func(r *Record) { r.Netns = "/run/netns/x\n" }},
		{"unknown state", func(r *Record) { r.State = "gone" }},
		{"empty state", func(r *Record) { r.State = "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testRecord("net", "cid", "net1", "mlx5_0")
			tt.mod(r)
			if err := s.Put(r); err == nil {
				t.Fatalf("Put(%+v) succeeded", r)
			}
		})
	}
	if err := s.Put(nil); err == nil {
		t.Fatal("Put(nil) succeeded")
	}
	if entries, _ := os.ReadDir(s.Dir()); len(entries) != 0 {
		t.Fatalf("rejected Puts left files behind: %v", entries)
	}
}

func TestGetDeleteRejectInvalidKey(t *testing.T) {
	s := newStore(t)
	k := Key{Network: "net", ContainerID: "../../etc", IfName: "net1"}
	if _, err := s.Get(k); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(invalid) = %v, want a validation error", err)
	}
	if err := s.Delete(k); err == nil {
		t.Fatal("Delete(invalid) succeeded")
	}
}

func TestListSortedAndIgnoresTempFiles(t *testing.T) {
	s := newStore(t)
	recs := []*Record{
		testRecord("net-b", "c1", "net1", "mlx5_2"),
		testRecord("net-a", "c2", "net1", "mlx5_1"),
		testRecord("net-a", "c1", "net2", "mlx5_3"),
		testRecord("net-a", "c1", "net1", "mlx5_0"),
	}
	for _, r := range recs {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}

	// Leftovers of a writer that crashed before its rename: one fresh (it
	// might still be live), one old.
	fresh := filepath.Join(s.Dir(), tempPrefix+"fresh")
	stale := filepath.Join(s.Dir(), tempPrefix+"stale")
	for _, p := range []string{fresh, stale} {
		if err := os.WriteFile(p, []byte(`{"version":1,"network":"tr`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * staleTempAge)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	// Files that are not ours are left alone.
	if err := os.WriteFile(filepath.Join(s.Dir(), "README"), []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}

	got, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var keys []string
	for _, r := range got {
		keys = append(keys, r.Key.String())
	}
	want := []string{"net-a/c1/net1", "net-a/c1/net2", "net-a/c2/net1", "net-b/c1/net1"}
	if !slices.Equal(keys, want) {
		t.Errorf("List keys = %q, want %q", keys, want)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file not cleaned up: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh temp file removed: %v", err)
	}
}

func TestCorruptRecords(t *testing.T) {
	s := newStore(t)
	good := testRecord("net", "good", "net1", "mlx5_0")
	if err := s.Put(good); err != nil {
		t.Fatal(err)
	}

	misplaced := testRecord("net", "other", "net1", "mlx5_9")
	if err := s.Put(misplaced); err != nil {
		t.Fatal(err)
	}
	misplacedData, err := os.ReadFile(s.Path(misplaced.Key))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(misplaced.Key); err != nil {
		t.Fatal(err)
	}

	wrongVersion := strings.Replace(string(misplacedData), `"version": 1`, `"version": 2`, 1)
	if wrongVersion == string(misplacedData) {
		t.Fatal("test setup: version field not found")
	}

	cases := []struct {
		cid  string
		data string
		want string
	}{
		{"badjson", `{"version":1,`, "invalid JSON"},
		{"empty", ``, "invalid JSON"},
		{"version", wrongVersion, "schema version 2"},
		{"noversion", `{"network":"net","containerID":"noversion","ifName":"net1"}`, "schema version 0"},
		{"misplaced", string(misplacedData), "holds the record of net/other/net1"},
		{"baddevice", strings.Replace(string(misplacedData), `"mlx5_9"`, `"../x"`, 1), "RDMA device name"},
	}
	var corruptKeys []Key
	for _, c := range cases {
		k := Key{Network: "net", ContainerID: c.cid, IfName: "net1"}
		corruptKeys = append(corruptKeys, k)
		if err := os.WriteFile(s.Path(k), []byte(c.data), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := s.Get(k)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Get = %v, want ErrCorrupt", c.cid, err)
			continue
		}
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Path != s.Path(k) {
			t.Errorf("%s: Get error %v does not carry the path %s", c.cid, err, s.Path(k))
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), s.Path(k)) {
			t.Errorf("%s: Get error %q should mention %q and the file", c.cid, err, c.want)
		}
	}

	recs, err := s.List()
	if len(recs) != 1 || recs[0].Key != good.Key {
		t.Errorf("List returned %v, want only %s", recs, good.Key)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("List error = %v, want ErrCorrupt", err)
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != len(cases) {
		t.Errorf("List reported %d errors, want %d: %v", n, len(cases), err)
	}

	// Unreadable records are moved aside, where the operator finds them,
	// and no longer stand in the way of List.
	paths := CorruptPaths(err)
	if len(paths) != len(cases) {
		t.Fatalf("CorruptPaths = %v, want %d paths", paths, len(cases))
	}
	for _, p := range paths {
		if _, err := s.Quarantine(p); err != nil {
			t.Errorf("Quarantine(%s): %v", p, err)
		}
	}
	if recs, err := s.List(); err != nil || len(recs) != 1 || recs[0].Key != good.Key {
		t.Errorf("List after quarantine = %v, %v; want only %s", recs, err, good.Key)
	}
	damaged, err := s.Damaged()
	if err != nil || len(damaged) != len(cases) {
		t.Errorf("Damaged = %v, %v; want %d files", damaged, err, len(cases))
	}
	for _, k := range corruptKeys {
		if _, err := s.Get(k); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%s) after quarantine = %v, want ErrNotFound", k, err)
		}
	}
	if _, err := s.Quarantine(filepath.Join(t.TempDir(), "x.json")); err == nil {
		t.Error("Quarantine accepted a file outside the state directory")
	}
}

func TestSymlinkIsCorrupt(t *testing.T) {
	s := newStore(t)
	k := Key{Network: "net", ContainerID: "cid", IfName: "net1"}
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(target, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, s.Path(k)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(k); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get through symlink = %v, want ErrCorrupt", err)
	}
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Fatalf("Delete followed the symlink: %v", err)
	}
}

// TestConcurrentReadModifyWrite relies on the lock for correctness: without
// it, concurrent increments would be lost.
func TestConcurrentReadModifyWrite(t *testing.T) {
	s := newStore(t)
	k := Key{Network: "net", ContainerID: "counter", IfName: "net1"}
	const workers, rounds = 16, 10

	var wg sync.WaitGroup
	errc := make(chan error, workers*rounds)
	for range workers {
		wg.Go(func() {
			for range rounds {
				errc <- increment(s, k)
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.Get(k)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rule != strconv.Itoa(workers*rounds) {
		t.Fatalf("counter = %s, want %d", r.Rule, workers*rounds)
	}
}

func increment(s *Store, k Key) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	unlock, err := s.Lock(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, unlock()) }()

	n := 0
	r, err := s.Get(k)
	switch {
	case errors.Is(err, ErrNotFound):
		r = &Record{Key: k, Netns: "/proc/1/ns/net", Device: "mlx5_0", State: StateAttached}
	case err != nil:
		return err
	default:
		if n, err = strconv.Atoi(r.Rule); err != nil {
			return err
		}
	}
	// Widen the race window so a broken lock shows up reliably.
	time.Sleep(100 * time.Microsecond)
	r.Rule = strconv.Itoa(n + 1)
	return s.Put(r)
}

// Readers open the directory as it is: a 0755 directory created by
// kubelet, on a read-only mount, is not chmod'ed, and a missing one is
// not created.
func TestOpenChangesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if _, err := Open(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open of a missing directory = %v, want ErrNotExist", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("Open created the directory")
	}
	w, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := testRecord("net", "cid", "net1", "mlx5_0")
	if err := w.Put(r); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, tempPrefix+"left")
	if err := os.WriteFile(old, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(old, past, past)
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.List()
	if err != nil || len(recs) != 1 {
		t.Fatalf("List = %v, %v", recs, err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o755 {
		t.Errorf("Open changed the mode to %o", fi.Mode().Perm())
	}
	if _, err := os.Stat(old); err != nil {
		t.Error("a read-only List removed a temp file")
	}
}

// Records written by earlier builds are found under the same name and
// read back as they were, so an upgrade needs no migration step: the
// files below are what builds wrote (the first with the escaped '<', '>'
// and '&' of json.MarshalIndent, the others as encode writes them), and
// the names are SHA-256 of network, container ID and interface name
// joined by NUL (printf 'rdma-net\0003f2a9c0e1b7d\000net1' | sha256sum).
func TestRecordFilesOfEarlierBuilds(t *testing.T) {
	const full = `{
  "version": 1,
  "network": "rdma-net",
  "containerID": "3f2a9c0e1b7d",
  "ifName": "net1",
  "netns": "/var/run/netns/cni-5d1c2a",
  "netnsDev": 4,
  "netnsIno": 4026532840,
  "rdmaDevice": "mlx5_0",
  "podDevName": "rdma_net1",
  "devPath": "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
  "pciAddress": "0000:3b:00.0",
  "rule": "netdev net1 (parent pci/0000:3b:00.0): directly under \"it\" <&>",
  "state": "attached",
  "qos": true,
  "k8sNamespace": "team-a",
  "k8sPod": "trainer-0",
  "created": "2026-11-23T14:05:06.000000789Z"
}
`
	const bare = `{
  "version": 1,
  "network": "n",
  "containerID": "c",
  "ifName": "net1",
  "netns": "/proc/4711/ns/net",
  "rdmaDevice": "irdma0",
  "state": "moving",
  "created": "2026-01-02T03:04:05+02:00"
}
`
	escaped := strings.Replace(full, "<&>", `\u003c\u0026\u003e`, 1)
	wantFull := Record{
		Version: 1, Key: Key{Network: "rdma-net", ContainerID: "3f2a9c0e1b7d", IfName: "net1"},
		Netns: "/var/run/netns/cni-5d1c2a", NetnsDev: 4, NetnsIno: 4026532840,
		Device: "mlx5_0", PodName: "rdma_net1", DevPath: "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
		PCIAddress: "0000:3b:00.0", Rule: `netdev net1 (parent pci/0000:3b:00.0): directly under "it" <&>`,
		State: StateAttached, QoS: true, K8sNamespace: "team-a", K8sPod: "trainer-0",
		Created: time.Date(2026, 11, 23, 14, 5, 6, 789, time.UTC),
	}
	for _, c := range []struct {
		name, file, data, rewritten string
		key                         Key
		device                      string
	}{
		{"full, escaped", "6c25da08d64cc52174bf14584a6ab8b57d7f7fed0d5d50155f8141a54dc0ae58.json", escaped, full, wantFull.Key, "mlx5_0"},
		{"full", "6c25da08d64cc52174bf14584a6ab8b57d7f7fed0d5d50155f8141a54dc0ae58.json", full, full, wantFull.Key, "mlx5_0"},
		{"bare", "72159ca8ab9adb256c2e1c63a274e53bd7965e09f21e5404e38ffcf840ca7de8.json", bare, bare, Key{Network: "n", ContainerID: "c", IfName: "net1"}, "irdma0"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, c.file), []byte(c.data), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Get(c.key)
		if err != nil {
			t.Fatalf("%s: the record of an earlier build is not found: %v", c.name, err)
		}
		if r.Device != c.device {
			t.Errorf("%s: device %q, want %q", c.name, r.Device, c.device)
		}
		if c.key == wantFull.Key && *r != wantFull {
			t.Errorf("%s: read back as %+v, want %+v", c.name, *r, wantFull)
		}
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, c.file))
		if err != nil {
			t.Fatalf("%s: rewritten under another name: %v", c.name, err)
		}
		if string(got) != c.rewritten {
			t.Errorf("%s: rewritten as\n%s\nwant\n%s", c.name, got, c.rewritten)
		}
	}
}
