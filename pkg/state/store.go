// Package state records which RDMA device belongs to which CNI attachment
// on this node, so DEL, CHECK and GC find the device again after the ADD
// process is gone, and so two pods can never own the same device.
//
// Each attachment is one JSON file, replaced atomically. Callers serialize
// read-modify-write sequences across processes with two kinds of lock: the
// node-wide Store.Lock while they read the records and decide which device
// is whose, and one Store.LockDevice per device while they move it and
// write its record. The individual methods do not lock.
package state

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// DefaultDir sits next to the state of the reference CNI plugins.
const DefaultDir = "/var/lib/cni/rdma-netns"

const (
	dirPerm  = 0o700
	filePerm = 0o600

	lockFileName = "lock"
	// tempPrefix cannot collide with record names, which are lowercase hex.
	tempPrefix = ".tmp-"
	// staleTempAge decides when a temp file is a crashed writer's leftover.
	// Removing a live writer's temp file would only fail its rename, but a
	// writer takes microseconds, so anything this old is certainly dead.
	staleTempAge = 10 * time.Minute
)

// Store is a state directory. It holds no open files; it is safe for
// concurrent use as far as the file system allows, but read-modify-write
// sequences need Lock.
type Store struct {
	dir string
	// readOnly stores (Open) leave the directory exactly as they found it.
	readOnly bool
}

// New opens the state directory, creating it (and parents) if needed. An
// empty dir means DefaultDir. The directory is forced to mode 0700 because
// it reveals which pods hold which devices.
func New(dir string) (*Store, error) {
	dir, err := dirPath(dir)
	if err != nil {
		return nil, err
	}
	if err = os.MkdirAll(dir, dirPerm); err != nil {
		return nil, fmt.Errorf("creating rdma-netns state directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("checking rdma-netns state directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("rdma-netns state directory %s exists but is not a directory; remove it or configure another path", dir)
	}
	if fi.Mode().Perm() != dirPerm {
		if err := os.Chmod(dir, dirPerm); err != nil {
			return nil, fmt.Errorf("restricting permissions of rdma-netns state directory %s to %o: %w", dir, dirPerm, err)
		}
	}
	return &Store{dir: dir}, nil
}

// dirPath is the state directory dir names: DefaultDir when it is empty,
// and only an absolute path.
func dirPath(dir string) (string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("rdma-netns state directory %q must be an absolute path", dir)
	}
	return filepath.Clean(dir), nil
}

// Open opens an existing state directory for reading only: it neither
// creates the directory nor changes its mode, and List leaves temp files
// alone, so readers (the doctor, the exporter on a read-only mount) change
// nothing on the node. A missing directory is an fs.ErrNotExist error.
func Open(dir string) (*Store, error) {
	dir, err := dirPath(dir)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("rdma-netns state directory %s exists but is not a directory", dir)
	}
	return &Store{dir: dir, readOnly: true}, nil
}

// Dir returns the absolute, cleaned state directory.
func (s *Store) Dir() string { return s.dir }

// Path returns the file that holds (or would hold) the record for k. It is
// meant for messages; the key is not validated.
func (s *Store) Path(k Key) string { return filepath.Join(s.dir, k.fileName()) }

// Get returns the record for k, an error matching ErrNotFound if there is
// none, or one matching ErrCorrupt if the file cannot be trusted.
func (s *Store) Get(k Key) (*Record, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	r, err := s.read(k.fileName())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w for %s", ErrNotFound, k)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// read loads and checks one record file. A missing file is returned as an
// fs.ErrNotExist error, unwrapped by CorruptError.
func (s *Store) read(name string) (*Record, error) {
	path := filepath.Join(s.dir, name)
	// O_NOFOLLOW: nothing legitimate puts a symlink here, and following one
	// would let whoever planted it choose what we believe about a device.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if errors.Is(err, syscall.ELOOP) {
			return nil, &CorruptError{Path: path, Err: errors.New("is a symbolic link")}
		}
		return nil, fmt.Errorf("reading rdma-netns state: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRecordSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading rdma-netns state: %w", err)
	}
	r, err := DecodeRecord(data)
	if err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return nil, &CorruptError{Path: path, Err: ce.Err}
		}
		return nil, err
	}
	// A copied or hand-edited file would otherwise make one attachment's
	// record answer for another.
	if want := r.Key.fileName(); want != name {
		return nil, &CorruptError{Path: path, Err: fmt.Errorf("holds the record of %s, which belongs in %s", r.Key, want)}
	}
	return r, nil
}

// Put validates r and atomically replaces the record for r.Key. It sets
// r.Version, and r.Created if zero. Callers must hold the lock when the
// write depends on what they read.
func (s *Store) Put(r *Record) error {
	if r == nil {
		return errors.New("rdma-netns state: cannot store a nil record")
	}
	r.Version = SchemaVersion
	if r.Created.IsZero() {
		r.Created = time.Now().UTC()
	}
	if err := r.validate(); err != nil {
		return fmt.Errorf("refusing to store rdma-netns state for %s: %w", r.Key, err)
	}
	data, err := r.encode()
	if err != nil {
		return err
	}
	if err := s.writeAtomic(r.Key.fileName(), data); err != nil {
		return fmt.Errorf("storing rdma-netns state for %s: %w", r.Key, err)
	}
	return nil
}

// writeAtomic makes sure a reader, or the next process after one was
// killed, sees either the old record or the new one, never a torn or empty
// file: the data goes to a temp file that is renamed over the target. There
// is no fsync: the page cache outlives any process, and what outlives the
// page cache -- a power loss, a kernel crash -- also destroys every pod
// netns and re-registers every RDMA device under its driver's name, which
// leaves nothing for any record to undo. A durable write would cost every
// ADD a disk flush for nothing.
func (s *Store) writeAtomic(name string, data []byte) (err error) {
	tmp, err := os.CreateTemp(s.dir, tempPrefix+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp already uses 0600; be explicit since it is the contract.
	if err = tmp.Chmod(filePerm); err != nil {
		return err
	}
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(s.dir, name))
}

// Delete removes the record for k. It does not read the file, so a corrupt
// record can always be removed; a missing one is not an error because DEL
// must be idempotent.
func (s *Store) Delete(k Key) error {
	if err := k.Validate(); err != nil {
		return err
	}
	err := os.Remove(filepath.Join(s.dir, k.fileName()))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting rdma-netns state for %s: %w", k, err)
	}
	return nil
}

// List returns every readable record, sorted by key. Unreadable records are
// reported in an errors.Join'ed error (matching ErrCorrupt where that is
// the cause) alongside the good ones, so one bad file cannot stop GC from
// handling all the others. Stale temp files are removed on the way.
func (s *Store) List() ([]*Record, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing rdma-netns state in %s: %w", s.dir, err)
	}
	var recs []*Record
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, tempPrefix) {
			if !s.readOnly {
				s.removeIfStale(name)
			}
			continue
		}
		if !isRecordFileName(name) {
			continue
		}
		r, err := s.read(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since ReadDir
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b *Record) int { return compareKeys(a.Key, b.Key) })
	return recs, errors.Join(errs...)
}

// removeIfStale is best effort: failing to clean up must not fail List.
func (s *Store) removeIfStale(name string) {
	path := filepath.Join(s.dir, name)
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || time.Since(fi.ModTime()) < staleTempAge {
		return
	}
	_ = os.Remove(path)
}

// DamagedDir is the folder, inside the state directory, where unreadable
// records are moved: kept for the operator, out of everyone's way.
const DamagedDir = "damaged"

// Quarantine moves an unreadable record file into DamagedDir, so it blocks
// nobody while its content stays available to whoever wants to know what
// went wrong. It returns the new path.
func (s *Store) Quarantine(path string) (string, error) {
	if filepath.Dir(path) != s.dir || !isRecordFileName(filepath.Base(path)) {
		return "", fmt.Errorf("%s is not a record file of %s", path, s.dir)
	}
	dir := filepath.Join(s.dir, DamagedDir)
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	dst := filepath.Join(dir, time.Now().UTC().Format("20060102T150405.000000000Z")+"-"+filepath.Base(path))
	if err := os.Rename(path, dst); err != nil {
		return "", fmt.Errorf("moving unreadable record %s aside: %w", path, err)
	}
	return dst, nil
}

// Damaged lists the files moved aside by Quarantine.
func (s *Store) Damaged() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, DamagedDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, filepath.Join(s.dir, DamagedDir, e.Name()))
	}
	return out, nil
}

// CorruptPaths returns the files of the unreadable records an error from
// List reports.
func CorruptPaths(listErr error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var ce *CorruptError
		if errors.As(err, &ce) && ce.Path != "" {
			out = append(out, ce.Path)
		}
	}
	walk(listErr)
	return out
}

// RenamedDir holds one note per device that DEL returned to the host under
// its pod-side name because its record, and with it the host name, was
// lost: the node keeps a device named as one pod wanted, and only a person
// can tell which name it should have.
const RenamedDir = "renamed"

// NoteLostName records that device came back under its pod-side name.
func (s *Store) NoteLostName(device, text string) error {
	if err := ValidateDeviceName(device); err != nil {
		return err
	}
	dir := filepath.Join(s.dir, RenamedDir)
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, device), []byte(text+"\n"), filePerm)
}

// LostNames returns the notes written by NoteLostName, by device name.
func (s *Store) LostNames() (map[string]string, error) {
	return s.notes(RenamedDir)
}

// ReservedDir holds one file per RDMA device name that a network's
// configuration gives its pods (rdmaDevName), written by the first ADD of
// that network on the node and holding the network's name. A name a pod
// chooses itself (podRdmaDevNamePrefix) may not be one of them: RDMA
// device names are node-wide, and a pod holding such a name would keep
// the network's pods from starting on the node. A name stays reserved
// across reboots until someone removes its file.
const ReservedDir = "reserved-names"

// ReserveName records that network gives its pods' RDMA devices name on
// this node, unless the name is reserved already.
func (s *Store) ReserveName(name, network string) error {
	if err := ValidateDeviceName(name); err != nil {
		return err
	}
	path := filepath.Join(s.dir, ReservedDir, name)
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), dirPerm); err != nil {
		return err
	}
	return s.writeAtomic(filepath.Join(ReservedDir, name), []byte(network+"\n"))
}

// NameReservedBy is the network that reserved name on this node, "" if
// none did.
func (s *Store) NameReservedBy(name string) (string, error) {
	if err := ValidateDeviceName(name); err != nil {
		return "", err
	}
	text, err := readNote(filepath.Join(s.dir, ReservedDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return text, err
}

// ReservedNames returns every reserved name with the network that
// reserved it.
func (s *Store) ReservedNames() (map[string]string, error) {
	return s.notes(ReservedDir)
}

// notes reads the files of a notes directory by name; a missing directory
// holds none.
func (s *Store) notes(subdir string) (map[string]string, error) {
	dir := filepath.Join(s.dir, subdir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		if ValidateDeviceName(e.Name()) != nil {
			continue
		}
		text, err := readNote(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		out[e.Name()] = text
	}
	return out, nil
}

// readNote reads the first 4 KiB of a note, never through a link.
func readNote(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	return strings.TrimSpace(string(data)), err
}
