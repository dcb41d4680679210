package drarecord

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// within fails the test when fn has not returned after 5 s: a reader
// blocked on a FIFO must fail the test, not hang the run. fn only keeps
// what the call returned, the test checks it after: a call let go by
// mkfifo's cleanup may return after the test ended.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s still blocked after 5s", what)
	}
}

// mkfifo makes a FIFO at path. Cleanup opens it for writing once, which
// lets go a reader that blocked opening it, before TempDir removes it.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

// A FIFO named like a record (anyone with write access to the directory
// can make one) blocks no reader: not the driver's Prepare, not the CNI
// plugin's ADD, not the doctor or the exporter. Each sees it as a damaged
// record and still gets the whole ones.
func TestFIFOBlocksNoReader(t *testing.T) {
	d := Dir(t.TempDir())
	for _, c := range []*Claim{claim("c1", podA, "a", "x", dev("a", "0000:00:05.0")), claim("c2", podB, "b", "y")} {
		if err := d.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	mkfifo(t, filepath.Join(string(d), "c3.json"))

	t.Run("Load", func(t *testing.T) {
		var c *Claim
		var ok bool
		var err error
		within(t, "Load of a FIFO", func() { c, ok, err = d.Load("c3") })
		if err == nil || ok || c != nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Load = %+v, %v, %v; want an error saying it is not a regular file", c, ok, err)
		}
	})
	t.Run("List", func(t *testing.T) {
		var claims []*Claim
		var bad []string
		var err error
		within(t, "List beside a FIFO", func() { claims, bad, err = d.List() })
		if err != nil || len(claims) != 2 || claims[0].ClaimUID != "c1" || claims[1].ClaimUID != "c2" {
			t.Errorf("List = %+v, %v; want c1 and c2", claims, err)
		}
		if len(bad) != 1 || !strings.Contains(bad[0], "c3.json") || !strings.Contains(bad[0], "not a regular file") {
			t.Errorf("bad = %q, want c3.json, not a regular file", bad)
		}
	})
	t.Run("PodDevices", func(t *testing.T) {
		var devs []Device
		var err error
		within(t, "PodDevices beside a FIFO", func() { devs, _, err = d.PodDevices(podA) })
		if err != nil || len(devs) != 1 || devs[0].PCIAddress != "0000:00:05.0" {
			t.Errorf("PodDevices = %+v, %v; want pod A's NIC", devs, err)
		}
	})
}

// A symbolic link named like a record is refused, even to a whole record:
// nothing the driver writes is a link, and following one would let whoever
// planted it choose which NIC a pod gets.
func TestSymlinkRecordRefused(t *testing.T) {
	d := Dir(t.TempDir())
	elsewhere := Dir(t.TempDir())
	if err := elsewhere.Write(claim("c7", podA, "a", "x", dev("a", "0000:00:05.0"))); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(string(elsewhere), "c7.json"), filepath.Join(string(d), "c7.json")); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := d.Load("c7"); err == nil || ok || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Load = %+v, %v, %v; want the link refused", c, ok, err)
	}
	claims, bad, err := d.List()
	if err != nil || len(claims) != 0 || len(bad) != 1 || !strings.Contains(bad[0], "c7.json") || !strings.Contains(bad[0], "not a regular file") {
		t.Errorf("List = %+v, bad %q, %v; want no claim and c7.json not a regular file", claims, bad, err)
	}
	if devs, _, err := d.PodDevices(podA); err != nil || len(devs) != 0 {
		t.Errorf("PodDevices = %+v, %v; want nothing through the link", devs, err)
	}
}

// ReadRegular, the one reader of the record directory and of the driver's
// inventory beside it: a regular file within the limit is read; anything
// else is an error naming what it is, and a missing file is ErrNotExist.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(path("small"), []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path("small"), path("link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path("dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	mkfifo(t, path("fifo"))
	if b, err := ReadRegular(path("small"), 5); err != nil || string(b) != "12345" {
		t.Errorf("ReadRegular(small, 5) = %q, %v", b, err)
	}
	if _, err := ReadRegular(path("small"), 4); err == nil || !strings.Contains(err.Error(), "larger than 4 bytes") {
		t.Errorf("ReadRegular(small, 4) = %v, want it too large", err)
	}
	if _, err := ReadRegular(path("none"), 4); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadRegular(none) = %v, want ErrNotExist", err)
	}
	for name, kind := range map[string]string{"link": "symbolic link", "dir": "directory", "fifo": "named pipe"} {
		var err error
		within(t, "ReadRegular("+name+")", func() { _, err = ReadRegular(path(name), 5) })
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), kind) || !strings.Contains(err.Error(), path(name)) {
			t.Errorf("ReadRegular(%s) = %v, want %s: not a regular file (%s)", name, err, path(name), kind)
		}
	}
}
