package podadjust

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// One remount of the sandbox's tmpfs resizes every bind mount of it (each
// container's /dev/shm), keeps the mount's flags and the files in it; a
// directory that is not a tmpfs mount root is refused.
func TestTmpfsResize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts tmpfs")
	}
	dir := t.TempDir()
	shm, ctr1, ctr2 := filepath.Join(dir, "shm"), filepath.Join(dir, "ctr1"), filepath.Join(dir, "ctr2")
	for _, d := range []string{shm, ctr1, ctr2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// As containerd mounts a sandbox's shm.
	if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(shm, unix.MNT_DETACH) })
	for _, c := range []string{ctr1, ctr2} {
		if err := unix.Mount(shm, c, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(c, unix.MNT_DETACH) })
	}
	if err := os.WriteFile(filepath.Join(ctr1, "nccl-seg"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ts Tmpfs
	if n, err := ts.Size(shm); err != nil || n != 64<<20 {
		t.Fatalf("Size = %d, %v; want 64Mi", n, err)
	}
	if err := ts.Resize(shm, 256<<20); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{shm, ctr1, ctr2} {
		if n, err := ts.Size(p); err != nil || n != 256<<20 {
			t.Errorf("%s: Size = %d, %v; want 256Mi after one remount", p, n, err)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(shm, &st); err != nil {
		t.Fatal(err)
	}
	if want := int64(unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC); st.Flags&want != want {
		t.Errorf("flags %#x after the remount, want nosuid,nodev,noexec kept", st.Flags)
	}
	if _, err := os.Stat(filepath.Join(ctr2, "nccl-seg")); err != nil {
		t.Errorf("a file written through one container's mount is not seen through the other's: %v", err)
	}

	plain := filepath.Join(shm, "sub")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Size(plain); err == nil {
		t.Error("a directory inside the tmpfs measured as a mount")
	}
	if err := ts.Resize(plain, 1<<30); err == nil {
		t.Error("a directory inside the tmpfs resized")
	}
	if _, err := ts.Size("/proc"); err == nil {
		t.Error("/proc measured as a tmpfs")
	}
}

// A tmpfs mounted without a size limit (size=0: statfs reports 0 blocks)
// measures as unlimited, not 0, so the pod's /dev/shm is not "grown" to a
// limit.
func TestTmpfsUnlimited(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts tmpfs")
	}
	root := t.TempDir()
	shm := filepath.Join(root, sandboxID, "shm")
	if err := os.MkdirAll(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("shm", shm, "tmpfs", 0, "size=0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(shm, unix.MNT_DETACH) })
	if n, err := (Tmpfs{}).Size(shm); err != nil || n != Unlimited {
		t.Fatalf("Size = %d, %v; want Unlimited", n, err)
	}
	a, _, s := world()
	a.Shm, a.Policy.SandboxRoots = Tmpfs{}, []string{root}
	adj, d := a.Adjust(pod(nil, 0), container(shm, 0))
	if adj == nil || !strings.Contains(d.Shm, "unlimited already") {
		t.Fatalf("decision %q, want /dev/shm left unlimited", d.Shm)
	}
	if n, _ := (Tmpfs{}).Size(shm); n != Unlimited || len(s.resized) > 0 {
		t.Fatalf("the unlimited tmpfs was resized to %d", n)
	}
}
