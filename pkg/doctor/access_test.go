package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// statusOf is a /proc/PID/status with the lines the access check reads.
func statusOf(uid, gid, groups, capEff string) string {
	return "Name:\tib_write_bw\nUid:\t" + uid + "\t" + uid + "\t" + uid + "\t" + uid + "\nGid:\t" + gid + "\t" + gid + "\t" + gid + "\t" + gid +
		"\nGroups:\t" + groups + "\nCapEff:\t" + capEff + "\n"
}

const (
	nodeMap = "         0          0 4294967295\n"
	// A hostUsers: false pod's: kubelet gives each pod 65536 IDs of
	// its own, from 65536 on.
	podMap = "         0     131072      65536\n"
	// capsDefault is a container's default set, CAP_DAC_OVERRIDE in it.
	capsDefault = "00000000a80425fb"
	capsNone    = "0000000000000000"
)

func TestParseCreds(t *testing.T) {
	c, err := ParseCreds(statusOf("131072", "131072", "131082 131083", capsDefault), podMap, podMap)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Known || c.FSUID != 131072 || c.FSGID != 131072 || len(c.Groups) != 2 || c.Groups[1] != 131083 || !c.DACOverride || !c.UserNS {
		t.Fatalf("pod in a user namespace: %+v", c)
	}
	if len(c.UIDMap) != 1 || c.UIDMap[0] != (IDRange{Inside: 0, Outside: 131072, Count: 65536}) {
		t.Fatalf("uid map %+v", c.UIDMap)
	}
	c, err = ParseCreds(statusOf("1000", "1000", "", capsNone), nodeMap, nodeMap)
	if err != nil || c.UserNS || c.DACOverride || c.FSUID != 1000 || len(c.Groups) != 0 {
		t.Fatalf("process of the node's namespace: %+v (%v)", c, err)
	}
	for _, bad := range []struct{ status, uidMap string }{
		{"Name:\tx\nCapEff:\t0\n", nodeMap},                                               // no Uid line
		{statusOf("x", "0", "", capsNone), nodeMap},                                       // not a number
		{statusOf("0", "0", "", capsNone), "0 0\n"},                                       // a map line short of a field
		{strings.Replace(statusOf("0", "0", "", capsNone), "CapEff", "CapX", 1), nodeMap}, // no CapEff
	} {
		if c, err := ParseCreds(bad.status, bad.uidMap, nodeMap); err == nil || c.Known {
			t.Errorf("ParseCreds(%q, %q) = %+v, want an error", bad.status, bad.uidMap, c)
		}
	}
}

func TestCanOpenRW(t *testing.T) {
	creds := func(status, m string) Creds {
		c, err := ParseCreds(status, m, m)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	podRoot := creds(statusOf("131072", "131072", "", capsDefault), podMap)
	nodeRoot := creds(statusOf("0", "0", "", capsDefault), nodeMap)
	nodeUser := creds(statusOf("1000", "1000", "44", capsNone), nodeMap)
	// Owned by one of the pod's own IDs (its root, 131072 on the node).
	podOwned := DevNode{Name: "uverbs0", UID: 131072, GID: 131072, Perm: 0o600}
	for _, tt := range []struct {
		name string
		c    Creds
		n    DevNode
		want bool
	}{
		{"the kernel's mode: anyone", podRoot, DevNode{Name: "uverbs0", Perm: 0o666}, true},
		{"root's alone, root of the node", nodeRoot, DevNode{Name: "uverbs0", Perm: 0o600}, true},
		// CAP_DAC_OVERRIDE of the pod's namespace does not count for
		// a node owned by the node's root, which is not mapped in it.
		{"root's alone, root of a user namespace", podRoot, DevNode{Name: "uverbs0", Perm: 0o600}, false},
		{"root's and rdma's, root of a user namespace", podRoot, DevNode{Name: "uverbs0", GID: 44, Perm: 0o660}, false},
		{"owned by the pod's root", podRoot, podOwned, true},
		{"owned by the pod's root, read-only", podRoot, DevNode{Name: "uverbs0", UID: 131072, GID: 131072, Perm: 0o400}, true},
		{"group rdma, a member", nodeUser, DevNode{Name: "uverbs0", GID: 44, Perm: 0o660}, true},
		{"group rdma read-only, a member", nodeUser, DevNode{Name: "uverbs0", GID: 44, Perm: 0o646}, false},
		{"others may, but the owner may not", nodeUser, DevNode{Name: "uverbs0", UID: 1000, Perm: 0o066}, false},
	} {
		if got := CanOpenRW(tt.c, tt.n); got != tt.want {
			t.Errorf("%s: CanOpenRW(%s) = %v, want %v", tt.name, tt.n, got, tt.want)
		}
	}
}

// procCreds gives a fake process the Uid, Gid and CapEff of its status,
// its ID maps, and its /dev/infiniband nodes a mode and owner.
func (fp *fakeProc) procCreds(pid, uid, capEff, idMap string, perm os.FileMode, nodeOwner int) {
	t := fp.t
	dir := filepath.Join(fp.root, pid)
	write(t, filepath.Join(dir, "status"), statusOf(uid, uid, "", capEff))
	write(t, filepath.Join(dir, "uid_map"), idMap)
	write(t, filepath.Join(dir, "gid_map"), idMap)
	nodes, err := os.ReadDir(filepath.Join(dir, "root", "dev", "infiniband"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		p := filepath.Join(dir, "root", "dev", "infiniband", n.Name())
		if err := os.Chown(p, nodeOwner, nodeOwner); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil {
			t.Fatal(err)
		}
	}
}

// A hostUsers: false pod's process that has its nodes, but bind-mounted
// from the node's own, root's alone: the doctor says it cannot open
// them, why, and what to do; with the nodes 0666 it says nothing more.
func TestPodUserNamespaceAccess(t *testing.T) {
	f := newNodeFixture(t)
	podA := filepath.Join(f.netnsDir, "pod-a")
	f.fp.proc("41", "ib_write_bw", "pod-a", "unlimited", capsDefault, 16<<30, "uverbs1", "rdma_cm")
	f.fp.procCreds("41", "131072", capsDefault, podMap, 0o600, 0)
	// The same pod's root on the node's own namespace opens them anyway.
	f.fp.proc("42", "ib_write_bw", "pod-a", "unlimited", capsDefault, 16<<30, "uverbs1", "rdma_cm")
	f.fp.procCreds("42", "0", capsDefault, nodeMap, 0o600, 0)

	r := CheckPod(f.env, podA, 0)
	fs := findingsOf(r, "char-access")
	if len(fs) != 1 || fs[0].Severity != Fail || fs[0].Subject != "pid 41 (ib_write_bw)" || r.ExitCode != 1 {
		t.Fatalf("char-access findings %+v (exit %d), want one FAIL for pid 41", fs, r.ExitCode)
	}
	for _, want := range []string{"/dev/infiniband/rdma_cm (owner 0:0, mode 0600)", "/dev/infiniband/uverbs1 (owner 0:0, mode 0600)",
		"user namespace", "hostUsers: false", "uid 131072", "Permission denied", "bind-mounts the node's own device nodes"} {
		if !strings.Contains(fs[0].Reason, want) {
			t.Errorf("reason lacks %q: %s", want, fs[0].Reason)
		}
	}
	for _, want := range []string{"mode 0666", "hostUsers: true"} {
		if !strings.Contains(fs[0].Remedy, want) {
			t.Errorf("remedy lacks %q: %s", want, fs[0].Remedy)
		}
	}
	// Not something the NRI plugin would have given.
	if nri := findingsOf(r, "nri"); len(nri) != 0 {
		t.Errorf("nri findings %+v", nri)
	}
	// The process's view in the report: who it is, what its nodes are.
	pr := r.Pod.Processes[1]
	if pr.PID != 41 || !pr.Creds.UserNS || len(pr.Nodes) != 2 || pr.Nodes[1].Perm != 0o600 {
		t.Errorf("process %+v", pr)
	}

	f.fp.procCreds("41", "131072", capsDefault, podMap, 0o666, 0)
	r = CheckPod(f.env, podA, 0)
	if fs := findingsOf(r, "char-access"); len(fs) != 0 || r.ExitCode != 0 {
		t.Errorf("nodes 0666: char-access findings %+v (exit %d), want none", fs, r.ExitCode)
	}
}

// A process of the node's namespace running as a user, without
// CAP_DAC_OVERRIDE, on nodes root's alone: the same failure, said for
// what it is.
func TestPodUnprivilegedAccess(t *testing.T) {
	f := newNodeFixture(t)
	f.fp.proc("41", "python", "pod-a", "unlimited", capsNone, 16<<30, "uverbs1", "rdma_cm")
	f.fp.procCreds("41", "1000", capsNone, nodeMap, 0o600, 0)
	r := CheckPod(f.env, filepath.Join(f.fp.root, "41", "ns", "net"), 41)
	fs := findingsOf(r, "char-access")
	if len(fs) != 1 || fs[0].Severity != Fail || !strings.Contains(fs[0].Reason, "uid 1000 gid 1000 without CAP_DAC_OVERRIDE") || strings.Contains(fs[0].Reason, "user namespace") {
		t.Fatalf("char-access findings %+v", fs)
	}
}
