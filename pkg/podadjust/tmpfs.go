package podadjust

import (
	"fmt"
	"math"
	"math/bits"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Tmpfs measures and resizes tmpfs mounts as the plugin's mount namespace
// sees them (the host's, or one the sandbox directories propagate into).
type Tmpfs struct{}

// Unlimited is the size of a tmpfs without a size limit.
const Unlimited = math.MaxUint64

// Size is the size of the tmpfs whose root is at path; Unlimited for one
// mounted without a limit (size=0), which statfs reports as 0 blocks. A
// path that is not a mount root is refused: the sandbox's shm directory
// without its mount would otherwise measure /run.
func (Tmpfs) Size(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := mountRoot(path, &st); err != nil {
		return 0, err
	}
	if st.Blocks == 0 {
		return Unlimited, nil
	}
	hi, lo := bits.Mul64(st.Blocks, uint64(st.Bsize))
	if hi != 0 {
		return Unlimited, nil
	}
	return lo, nil
}

// Resize remounts the tmpfs at path with a new size. The superblock holds
// the size, so every bind mount of it (each container's /dev/shm) sees the
// new size at once. The mount flags are passed as they are, or the
// remount would drop nosuid, nodev and noexec from this mount.
func (Tmpfs) Resize(path string, bytes uint64) error {
	var st unix.Statfs_t
	if err := mountRoot(path, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_REMOUNT)
	for _, f := range mountFlags {
		if st.Flags&f.st != 0 {
			flags |= f.ms
		}
	}
	if err := unix.Mount("", path, "", flags, "size="+strconv.FormatUint(bytes, 10)); err != nil {
		return fmt.Errorf("remount %s with size %d: %w", path, bytes, err)
	}
	return nil
}

// mountRoot checks that path is the root of a tmpfs mount: a tmpfs there,
// and a different file system from its parent directory's.
func mountRoot(path string, st *unix.Statfs_t) error {
	if err := unix.Statfs(path, st); err != nil {
		return err
	}
	if st.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is not a tmpfs", path)
	}
	var self, parent unix.Stat_t
	if err := unix.Stat(path, &self); err != nil {
		return err
	}
	if err := unix.Stat(filepath.Dir(filepath.Clean(path)), &parent); err != nil {
		return err
	}
	if self.Dev == parent.Dev {
		return fmt.Errorf("%s is not a mount of its own (is the pod sandbox gone?)", path)
	}
	return nil
}

// mountFlags maps statfs's ST_ flags to mount's MS_ flags. Most have the
// same value, but not all: ST_RELATIME is MS_BIND's, and a bind remount
// would change this mount's flags and leave the size alone.
var mountFlags = []struct {
	st int64
	ms uintptr
}{
	{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV},
	{unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_SYNCHRONOUS, unix.MS_SYNCHRONOUS}, {unix.ST_NOATIME, unix.MS_NOATIME},
	{unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
}
