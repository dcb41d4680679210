package doctor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
)

const limitsFile = `Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max file size             unlimited            unlimited            bytes     
Max locked memory         %s            %s            bytes     
Max address space         unlimited            unlimited            bytes     
`

func limits(soft, hard string) string {
	return strings.Replace(strings.Replace(limitsFile, "%s", soft, 1), "%s", hard, 1)
}

func TestParseMemlock(t *testing.T) {
	tests := []struct {
		in         string
		soft, hard Limit
		err        bool
	}{
		{limits("8388608", "8388608"), Limit{Bytes: 8 << 20, Known: true}, Limit{Bytes: 8 << 20, Known: true}, false},
		{limits("65536", "unlimited"), Limit{Bytes: 64 << 10, Known: true}, Limit{Unlimited: true, Known: true}, false},
		{limits("unlimited", "unlimited"), Limit{Unlimited: true, Known: true}, Limit{Unlimited: true, Known: true}, false},
		{limits("0", "0"), Limit{Known: true}, Limit{Known: true}, false},
		{limits("lots", "0"), Limit{}, Limit{}, true},
		{"Max locked memory\n", Limit{}, Limit{}, true},
		{"Max cpu time unlimited unlimited seconds\n", Limit{}, Limit{}, true},
		{"", Limit{}, Limit{}, true},
	}
	for _, tt := range tests {
		soft, hard, err := ParseMemlock(tt.in)
		if (err != nil) != tt.err {
			t.Errorf("ParseMemlock(%q) error = %v, want error %v", tt.in, err, tt.err)
			continue
		}
		if !tt.err && (soft != tt.soft || hard != tt.hard) {
			t.Errorf("ParseMemlock(%q) = %+v, %+v, want %+v, %+v", tt.in, soft, hard, tt.soft, tt.hard)
		}
	}
}

func TestParseCapEff(t *testing.T) {
	status := "Name:\tsleep\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t%s\nCapBnd:\t000001ffffffffff\n"
	tests := []struct {
		capEff string
		ipc    bool
		err    bool
	}{
		{"000001ffffffffff", true, false},  // root
		{"00000000a80425fb", false, false}, // docker default set: no IPC_LOCK
		{"00000000a80465fb", true, false},  // docker default + IPC_LOCK
		{"0000000000004000", true, false},  // only bit 14
		{"0000000000002000", false, false},
		{"0000000000000000", false, false},
		{"zz", false, true},
	}
	for _, tt := range tests {
		set, err := ParseCapEff(strings.Replace(status, "%s", tt.capEff, 1))
		if (err != nil) != tt.err {
			t.Errorf("CapEff %s: error %v", tt.capEff, err)
			continue
		}
		if got := HasCap(set, capIPCLock); !tt.err && got != tt.ipc {
			t.Errorf("CapEff %s: CAP_IPC_LOCK = %v, want %v", tt.capEff, got, tt.ipc)
		}
	}
	if _, err := ParseCapEff("Name:\tx\n"); err == nil {
		t.Error("status without CapEff parsed")
	}
	if HasCap(^uint64(0), 64) {
		t.Error("HasCap beyond 63")
	}
}

func TestMemlockVerdict(t *testing.T) {
	known := func(n uint64) Limit { return Limit{Bytes: n, Known: true} }
	tests := []struct {
		name string
		pr   Process
		want Severity
	}{
		{"container default 8MiB", Process{Memlock: known(8 << 20)}, Fail},
		{"64KiB", Process{Memlock: known(64 << 10)}, Fail},
		{"just below", Process{Memlock: known(MinMemlock - 1)}, Fail},
		{"at threshold", Process{Memlock: known(MinMemlock)}, OK},
		{"unlimited", Process{Memlock: Limit{Unlimited: true, Known: true}}, OK},
		{"low but CAP_IPC_LOCK", Process{Memlock: known(64 << 10), CapIPCLock: true}, OK},
		{"unknown", Process{}, Warn},
	}
	for _, tt := range tests {
		got, reason := MemlockVerdict(tt.pr)
		if got != tt.want {
			t.Errorf("%s: %s (%s), want %s", tt.name, got, reason, tt.want)
		}
		if got == Fail && !strings.Contains(reason, "ibv_reg_mr failed") {
			t.Errorf("%s: reason %q does not name the NCCL symptom", tt.name, reason)
		}
	}
}

func TestShmVerdict(t *testing.T) {
	tests := []struct {
		pr   Process
		want Severity
		in   string
	}{
		{Process{ShmBytes: 64 << 20}, Warn, "64MiB"},
		{Process{ShmBytes: MinShm - 1}, Warn, "posix_fallocate failed"},
		{Process{ShmBytes: MinShm}, OK, "1GiB"},
		{Process{ShmBytes: 16 << 30}, OK, "16GiB"},
		{Process{ShmErr: "no such file or directory"}, Warn, "no usable /dev/shm"},
	}
	for _, tt := range tests {
		got, reason := ShmVerdict(tt.pr)
		if got != tt.want || !strings.Contains(reason, tt.in) {
			t.Errorf("ShmVerdict(%+v) = %s %q, want %s mentioning %q", tt.pr, got, reason, tt.want, tt.in)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 1023: "1023B", 64 << 10: "64KiB", 64 << 20: "64MiB", 1 << 30: "1GiB", 1536 << 20: "1.5GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %s, want %s", n, got, want)
		}
	}
}

// fakeProc builds a /proc tree: each process has comm, limits, status, a
// root with dev/shm and dev/infiniband, and ns/net as a hard link to one
// of the netns files, so processes of one netns share an inode as they do
// on nsfs.
type fakeProc struct {
	t     *testing.T
	root  string
	nsDir string
	shm   map[string]uint64 // root/dev/shm path -> size
}

func newFakeProc(t *testing.T) *fakeProc {
	t.Helper()
	dir := t.TempDir()
	fp := &fakeProc{t: t, root: filepath.Join(dir, "proc"), nsDir: filepath.Join(dir, "ns"), shm: map[string]uint64{}}
	for _, d := range []string{fp.root, fp.nsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return fp
}

// netns returns the path of a fake netns file, creating it.
func (fp *fakeProc) netns(name string) string {
	p := filepath.Join(fp.nsDir, name)
	if _, err := os.Stat(p); err != nil {
		write(fp.t, p, "")
	}
	return p
}

func (fp *fakeProc) proc(pid, comm, netns, memlock, capEff string, shm uint64, chars ...string) {
	t := fp.t
	dir := filepath.Join(fp.root, pid)
	write(t, filepath.Join(dir, "comm"), comm+"\n")
	write(t, filepath.Join(dir, "limits"), limits(memlock, memlock))
	write(t, filepath.Join(dir, "status"), "Name:\t"+comm+"\nCapEff:\t"+capEff+"\n")
	mkdir(t, filepath.Join(dir, "ns"))
	if err := os.Link(fp.netns(netns), filepath.Join(dir, "ns", "net")); err != nil {
		t.Fatal(err)
	}
	shmDir := filepath.Join(dir, "root", "dev", "shm")
	mkdir(t, shmDir)
	fp.shm[shmDir] = shm
	for _, c := range chars {
		write(t, filepath.Join(dir, "root", "dev", "infiniband", c), "")
	}
}

func (fp *fakeProc) Proc() Proc {
	return Proc{Root: fp.root, Statfs: func(path string) (uint64, error) {
		n, ok := fp.shm[path]
		if !ok {
			return 0, errors.New("no such file or directory")
		}
		return n, nil
	}}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	mkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestProcInspectAndScan(t *testing.T) {
	fp := newFakeProc(t)
	fp.proc("1", "init", "host", "8388608", "000001ffffffffff", 1<<30)
	fp.proc("40", "pause", "pod", "8388608", "00000000a80425fb", 64<<20)
	fp.proc("41", "python", "pod", "65536", "00000000a80425fb", 64<<20, "uverbs0", "rdma_cm")
	fp.proc("42", "torchrun", "pod", "unlimited", "00000000a80465fb", 16<<30)
	write(t, filepath.Join(fp.root, "self"), "") // not a pid
	p := fp.Proc()

	id, err := inventory.Stat(fp.netns("pod"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.InNetns(id); len(got) != 3 || got[0] != 40 || got[2] != 42 {
		t.Fatalf("InNetns = %v, want [40 41 42]", got)
	}
	p.Self = 41
	if got := p.InNetns(id); len(got) != 2 {
		t.Fatalf("InNetns with Self = %v, want 41 left out", got)
	}

	pr := p.Inspect(41)
	if pr.Comm != "python" || pr.Memlock != (Limit{Bytes: 65536, Known: true}) || pr.CapIPCLock || !pr.CapKnown || pr.ShmBytes != 64<<20 {
		t.Fatalf("Inspect(41) = %+v", pr)
	}
	if strings.Join(pr.CharDevices, " ") != "rdma_cm uverbs0" {
		t.Fatalf("char devices %v", pr.CharDevices)
	}
	if pr := p.Inspect(40); !pr.Ignored {
		t.Fatal("pause not ignored")
	}
	if pr := p.Inspect(42); !pr.CapIPCLock || !pr.Memlock.Unlimited {
		t.Fatalf("Inspect(42) = %+v", pr)
	}
	// A process that is gone leaves everything unknown.
	pr = p.Inspect(999)
	if pr.Memlock.Known || pr.CapKnown || pr.ShmErr == "" {
		t.Fatalf("Inspect(999) = %+v", pr)
	}
}
