package nriplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultLock is the file both instances of the plugin lock: the one the
// runtime launches from its plugin directory and the one the DaemonSet
// runs as a container (it mounts /var/run/nri for the socket anyway).
// Whoever holds the lock serves; the other stands by. Two instances must
// never both adjust a container: the runtime fails a container whose
// rlimit or device two plugins set.
const DefaultLock = "/var/run/nri/rdma-netns-nri.lock"

// serveLock is an exclusive flock(2) on the lock file. The kernel drops
// it when the process dies, so a crashed instance never blocks the other.
type serveLock struct {
	f *os.File
}

// tryLock takes the lock without waiting, and writes who in the file. The
// lock is nil, with who holds it (what the holder wrote), when another
// process has it.
func tryLock(path, who string) (l *serveLock, holder string, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, "", fmt.Errorf("cannot create the directory of the lock file %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("cannot open the lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		data, _ := os.ReadFile(path)
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, strings.TrimSpace(string(data)), nil
		}
		return nil, "", fmt.Errorf("cannot lock %s: %w", path, err)
	}
	// Who serves, for the other instance's log and for the doctor.
	if err := f.Truncate(0); err == nil {
		fmt.Fprintln(f, who)
	}
	return &serveLock{f: f}, "", nil
}

// waitLock takes the lock, waiting up to timeout for its holder to let go.
func waitLock(path, who string, timeout time.Duration) (*serveLock, string, error) {
	deadline := time.Now().Add(timeout)
	for {
		l, holder, err := tryLock(path, who)
		if l != nil || err != nil || time.Now().After(deadline) {
			return l, holder, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// release lets the other instance serve. The file stays: removing it
// would let a third process lock a new file while one waits on the old.
func (l *serveLock) release() {
	if l == nil {
		return
	}
	l.f.Truncate(0)
	l.f.Close()
}
