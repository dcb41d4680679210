package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
// the caller forever.
//
// The lock is flock(2) on a file opened anew for every call. flock belongs
// to the open file description, so it excludes other processes and other
// goroutines of this process alike, and the kernel drops it when a holder
// dies, so a crashed plugin never leaves the node locked.
//
// The returned unlock may be called more than once; later calls do nothing.
func (s *Store) Lock(ctx context.Context) (unlock func() error, err error) {
	path := s.LockPath()
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, filePerm)
		if err != nil {
			return nil, fmt.Errorf("opening rdma-netns state lock: %w", err)
		}
		if err := flockWait(ctx, f); err != nil {
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
