package state

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two Lock calls in one process open the lock file separately, so they get
// two open file descriptions and contend exactly as two processes would.
func TestLockContentionAndTimeout(t *testing.T) {
	s := newStore(t)
	unlock := lockT(t, s)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Lock(ctx)
	if err == nil {
		t.Fatal("second Lock succeeded while the first is held")
	}
	if waited := time.Since(start); waited < 90*time.Millisecond {
		t.Errorf("second Lock gave up after %v, before its deadline", waited)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), s.LockPath()) {
		t.Errorf("error %q does not name the lock file %s", err, s.LockPath())
	}
	t.Logf("timeout error: %v", err)

	// A waiter gets the lock as soon as it is released.
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		u, err := s.Lock(ctx)
		if err == nil {
			err = u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("waiter returned while the lock is held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}

	// Cancellation is reported as such.
	unlock = lockT(t, s)
	defer unlock()
	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := s.Lock(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with canceled context = %v, want context.Canceled", err)
	}
}

func TestUnlockIdempotent(t *testing.T) {
	s := newStore(t)
	unlock, err := s.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := unlock(); err != nil {
			t.Fatal(err)
		}
	}
	lockT(t, s)()
}

// A lock file removed by hand must not let two holders coexist, one on the
// unlinked inode and one on the new file.
func TestLockFileRemovedWhileHeld(t *testing.T) {
	s := newStore(t)
	unlock := lockT(t, s)
	if err := os.Remove(s.LockPath()); err != nil {
		t.Fatal(err)
	}
	unlock2 := lockT(t, s) // gets the new file
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx); err == nil {
		t.Fatal("third Lock succeeded while the new lock file is held")
	}
	unlock()
	unlock2()
}

const helperEnv = "RDMA_NETNS_STATE_LOCK_HELPER_DIR"

// TestLockHelperProcess is not a real test: it is the child process of
// TestLockAcrossProcesses. It takes the lock, says so, and holds it until
// its stdin is closed.
func TestLockHelperProcess(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("helper process for TestLockAcrossProcesses")
	}
	s, err := New(dir)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	unlock, err := s.Lock(context.Background())
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = unlock()
	os.Exit(0)
}

func startLockHolder(t *testing.T, s *Store) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+s.Dir())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("helper process did not take the lock: %q, %v", line, err)
	}
	return cmd, stdin
}

func TestLockAcrossProcesses(t *testing.T) {
	s := newStore(t)

	// The child releases the lock on request.
	cmd, stdin := startLockHolder(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx); err == nil {
		t.Fatal("Lock succeeded while another process holds it")
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper process: %v", err)
	}
	lockT(t, s)()

	// A holder that dies without unlocking does not leave the node locked.
	cmd, _ = startLockHolder(t, s)
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx); err == nil {
		t.Fatal("Lock succeeded while another process holds it")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	lockT(t, s)()
}

// A device's lock excludes every other holder of that device's lock and
// nobody else: the node lock and other devices' locks stay free.
func TestDeviceLocks(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	unlock, err := s.LockDevice(ctx, "mlx5_0")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.TryLockDevice("mlx5_0"); err != nil || ok {
		t.Fatalf("TryLockDevice of a held device: ok %v, err %v; want not ok", ok, err)
	}
	other, ok, err := s.TryLockDevice("mlx5_1")
	if err != nil || !ok {
		t.Fatalf("TryLockDevice of another device: ok %v, err %v", ok, err)
	}
	other()
	node, err := s.Lock(ctx)
	if err != nil {
		t.Fatalf("node lock while a device is locked: %v", err)
	}
	node()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.LockDevice(short, "mlx5_0"); err == nil {
		t.Fatal("LockDevice of a held device succeeded")
	}
	unlock()
	again, ok, err := s.TryLockDevice("mlx5_0")
	if err != nil || !ok {
		t.Fatalf("TryLockDevice after release: ok %v, err %v", ok, err)
	}
	again()
	for _, bad := range []string{"", "../lock", "a/b"} {
		if _, err := s.LockDevice(ctx, bad); err == nil {
			t.Errorf("LockDevice(%q) succeeded", bad)
		}
	}
}

// A device's lock file keeps its kernel index; the lock still works with it
// there, and what is not an index there reads as none.
func TestDeviceIndexInLockFile(t *testing.T) {
	s := newStore(t)
	if got, ok := s.DeviceIndex("mlx5_0"); ok {
		t.Fatalf("index of a device never locked: %d", got)
	}
	unlock, err := s.LockDevice(context.Background(), "mlx5_0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetDeviceIndex("mlx5_0", 42); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.TryLockDevice("mlx5_0"); ok {
		t.Fatal("writing the index let go of the lock")
	}
	unlock()
	if got, ok := s.DeviceIndex("mlx5_0"); !ok || got != 42 {
		t.Fatalf("DeviceIndex = %d, %v; want 42", got, ok)
	}
	// The kernel's first device has index 0.
	if err := s.SetDeviceIndex("mlx5_0", 0); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.DeviceIndex("mlx5_0"); !ok || got != 0 {
		t.Fatalf("DeviceIndex = %d, %v; want 0", got, ok)
	}
	for _, bad := range []string{"", "x\n", "0x2a\n", "-1\n", "4294967296\n"} {
		os.WriteFile(s.DeviceLockPath("mlx5_0"), []byte(bad), 0o600)
		if got, ok := s.DeviceIndex("mlx5_0"); ok {
			t.Errorf("DeviceIndex with %q in the file = %d, want none", bad, got)
		}
	}
	if err := s.SetDeviceIndex("../lock", 1); err == nil {
		t.Error("SetDeviceIndex took a path for a device name")
	}
	// A link in place of the lock file is not written through.
	target := filepath.Join(t.TempDir(), "elsewhere")
	os.WriteFile(target, []byte("keep\n"), 0o600)
	os.Remove(s.DeviceLockPath("mlx5_0"))
	if err := os.Symlink(target, s.DeviceLockPath("mlx5_0")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetDeviceIndex("mlx5_0", 7); err == nil {
		t.Error("SetDeviceIndex wrote through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Errorf("the link's target was changed to %q", b)
	}
}

// An attachment's lock file lives as long as its record or its holder, so
// the directory does not grow with every pod the node ever ran.
func TestAttachmentLockFileGoesWithRecord(t *testing.T) {
	s := newStore(t)
	k := Key{Network: "rdma-net", ContainerID: "c1", IfName: "net1"}
	locks := func() int {
		entries, _ := os.ReadDir(s.Dir() + "/" + AttachmentLockDir)
		return len(entries)
	}
	unlock, err := s.LockAttachment(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.TryLockAttachment(k); ok {
		t.Fatal("TryLockAttachment of a held attachment succeeded")
	}
	if err := s.Put(&Record{Key: k, Netns: "/run/netns/p", Device: "mlx5_0", State: StateAttached}); err != nil {
		t.Fatal(err)
	}
	unlock()
	if n := locks(); n != 1 {
		t.Fatalf("%d lock files after a call that left a record, want 1", n)
	}
	unlock, ok, err := s.TryLockAttachment(k)
	if err != nil || !ok {
		t.Fatalf("TryLockAttachment after release: ok %v, err %v", ok, err)
	}
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	unlock()
	unlock() // a second call does nothing
	if n := locks(); n != 0 {
		t.Fatalf("%d lock files after the record went, want 0", n)
	}
}
