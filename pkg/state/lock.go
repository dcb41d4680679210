package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultLockTimeout is a suggested bound for Lock. The lock is held for
// milliseconds per operation, so waiting this long means a holder is hung;
// failing lets the runtime retry instead of stalling pod start-up.
const DefaultLockTimeout = 30 * time.Second

const (
	lockPollMin = time.Millisecond
	lockPollMax = 50 * time.Millisecond
)

// LockPath returns the node-wide lock file.
func (s *Store) LockPath() string { return filepath.Join(s.dir, lockFileName) }

// Lock takes the node-wide state lock, waiting until ctx is done. Give ctx
// a deadline (see DefaultLockTimeout): without one, a hung holder blocks
// the caller forever. It is held while a call reads the records and decides
// which device is whose, not while the kernel moves a device: that part
// holds only the device's own lock (LockDevice).
//
// The lock is flock(2) on a file opened anew for every call. flock belongs
// to the open file description, so it excludes other processes and other
// goroutines of this process alike, and the kernel drops it when a holder
// dies, so a crashed plugin never leaves the node locked.
//
// The returned unlock may be called more than once; later calls do nothing.
func (s *Store) Lock(ctx context.Context) (unlock func() error, err error) {
	return lockFile(ctx, s.LockPath(), true)
}

// DeviceLockDir holds one lock file per RDMA device, by its host name.
const DeviceLockDir = "devices"

// DeviceLockPath returns the lock file of the RDMA device named dev.
func (s *Store) DeviceLockPath(dev string) string {
	return filepath.Join(s.dir, DeviceLockDir, dev)
}

// LockDevice takes the lock of one RDMA device, waiting until ctx is done.
// Whoever changes where the device is, or the record that names it, holds
// it from the decision to the record's last write: ADD across its move,
// DEL and GC across their release. Calls on other devices do not wait for
// it, so their kernel moves overlap.
//
// Order: attachment lock, node lock, device lock. A caller may wait for a
// device lock while holding the node lock (Lock) or an attachment lock
// (LockAttachment), never for either while holding a device lock, and
// never for a second device lock; whoever holds the node lock takes
// attachment locks only without waiting (TryLockAttachment). So no two
// callers wait for each other.
func (s *Store) LockDevice(ctx context.Context, dev string) (unlock func() error, err error) {
	path, err := s.deviceLockFile(dev)
	if err != nil {
		return nil, err
	}
	return lockFile(ctx, path, true)
}

// TryLockDevice takes the lock of one RDMA device if nobody holds it; ok is
// false, and unlock nil, when another call does.
func (s *Store) TryLockDevice(dev string) (unlock func() error, ok bool, err error) {
	path, err := s.deviceLockFile(dev)
	if err != nil {
		return nil, false, err
	}
	unlock, err = lockFile(context.Background(), path, false)
	if errors.Is(err, errLocked) {
		return nil, false, nil
	}
	return unlock, err == nil, err
}

// DeviceIndex is the kernel index the RDMA device dev was last moved by,
// kept in its lock file by SetDeviceIndex; ok is false when there is none
// or the file says anything else. It is a hint only
// (rdmans.Netlink.MoveToNetns checks it with the kernel before using it),
// so a reboot, a driver reload or a damaged file costs a device dump, never
// a wrong move.
func (s *Store) DeviceIndex(dev string) (index uint32, ok bool) {
	if ValidateDeviceName(dev) != nil {
		return 0, false
	}
	b, err := os.ReadFile(s.DeviceLockPath(dev))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(n), true
}

// SetDeviceIndex keeps the device's kernel index in its lock file. Call it
// holding the device's lock (LockDevice), which is the only writer.
func (s *Store) SetDeviceIndex(dev string, index uint32) error {
	if err := ValidateDeviceName(dev); err != nil {
		return err
	}
	// The lock file exists while its lock is held; like the lock, never
	// follow a link put in its place.
	f, err := os.OpenFile(s.DeviceLockPath(dev), os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		return fmt.Errorf("keeping the index of RDMA device %s: %w", dev, err)
	}
	_, err = f.WriteString(strconv.FormatUint(uint64(index), 10) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("keeping the index of RDMA device %s: %w", dev, err)
	}
	return nil
}

func (s *Store) deviceLockFile(dev string) (string, error) {
	if err := ValidateDeviceName(dev); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(s.dir, DeviceLockDir), dirPerm); err != nil {
		return "", fmt.Errorf("creating rdma-netns device locks: %w", err)
	}
	return s.DeviceLockPath(dev), nil
}

// AttachmentLockDir holds one lock file per attachment that has a record
// or a call in progress.
const AttachmentLockDir = "attachments"

// LockAttachment takes the lock of one attachment, waiting until ctx is
// done: ADD and DEL of the same attachment hold it from start to end, so
// they follow one another as the runtime issued them, while calls on other
// attachments run beside them. Order: it is taken before the node lock and
// a device lock, never while holding either. The lock file goes when the
// lock is released and the attachment has no record.
func (s *Store) LockAttachment(ctx context.Context, k Key) (unlock func() error, err error) {
	path, err := s.attachmentLockFile(k)
	if err != nil {
		return nil, err
	}
	release, err := lockFile(ctx, path, true)
	if err != nil {
		return nil, err
	}
	return s.dropWithRecord(k, path, release), nil
}

// TryLockAttachment takes the lock of one attachment if nobody holds it.
func (s *Store) TryLockAttachment(k Key) (unlock func() error, ok bool, err error) {
	path, err := s.attachmentLockFile(k)
	if err != nil {
		return nil, false, err
	}
	release, err := lockFile(context.Background(), path, false)
	if errors.Is(err, errLocked) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return s.dropWithRecord(k, path, release), true, nil
}

func (s *Store) attachmentLockFile(k Key) (string, error) {
	if err := k.Validate(); err != nil {
		return "", err
	}
	dir := filepath.Join(s.dir, AttachmentLockDir)
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return "", fmt.Errorf("creating rdma-netns attachment locks: %w", err)
	}
	return filepath.Join(dir, strings.TrimSuffix(k.fileName(), recordSuffix)), nil
}

// dropWithRecord removes the lock file, while still holding it, when the
// attachment has no record: a waiter that opened it finds it unlinked
// after its flock and opens a new one (lockFile), so nothing grows with
// every pod the node ever ran.
func (s *Store) dropWithRecord(k Key, path string, release func() error) func() error {
	return sync.OnceValue(func() error {
		if _, err := os.Lstat(filepath.Join(s.dir, k.fileName())); errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(path)
		}
		return release()
	})
}

// errLocked is lockFile's answer, without wait, when another holds the lock.
var errLocked = errors.New("held by another call")

func lockFile(ctx context.Context, path string, wait bool) (unlock func() error, err error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, filePerm)
		if err != nil {
			return nil, fmt.Errorf("opening rdma-netns state lock: %w", err)
		}
		if wait {
			err = flockWait(ctx, f)
		} else {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if errors.Is(err, unix.EWOULDBLOCK) {
				err = errLocked
			} else if err != nil {
				err = fmt.Errorf("locking rdma-netns state lock %s: %w", path, err)
			}
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		// Someone may have removed or replaced the lock file between our
		// open and flock; a lock on an unlinked inode excludes nobody.
		if same, err := isCurrentFile(f, path); err != nil {
			f.Close()
			return nil, fmt.Errorf("checking rdma-netns state lock %s: %w", path, err)
		} else if !same {
			f.Close()
			continue
		}
		var once sync.Once
		var closeErr error
		return func() error {
			once.Do(func() {
				// Closing releases the flock; an explicit unlock first makes
				// the release independent of any other fd sharing the file.
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				if err := f.Close(); err != nil {
					closeErr = fmt.Errorf("releasing rdma-netns state lock %s: %w", path, err)
				}
			})
			return closeErr
		}, nil
	}
}

// flockWait polls a non-blocking flock rather than blocking in the kernel,
// because a blocked flock(2) cannot be interrupted when ctx ends.
func flockWait(ctx context.Context, f *os.File) error {
	fd := int(f.Fd())
	delay := lockPollMin
	var timer *time.Timer
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("locking rdma-netns state lock %s: %w", f.Name(), err)
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("gave up waiting for rdma-netns state lock %s: %w; another rdma-netns ADD/DEL/GC holds it (look for a hung plugin process, e.g. with `fuser %s`) and the operation can be retried",
				f.Name(), context.Cause(ctx), f.Name())
		case <-timer.C:
		}
		delay = min(2*delay, lockPollMax)
	}
}

func isCurrentFile(f *os.File, path string) (bool, error) {
	held, err := f.Stat()
	if err != nil {
		return false, err
	}
	cur, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(held, cur), nil
}
