package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/linkconf"
)

// SchemaVersion is written into every record. A reader that finds another
// version treats the file as corrupt rather than guessing at its meaning:
// misreading which device a pod owns could hand one device to two pods.
const SchemaVersion = 1

// Attachment states. A record is written as StateMoving before the device
// changes namespace and rewritten as StateAttached afterwards, so a crash
// in between leaves evidence that DEL/GC must look for the device in either
// namespace.
const (
	StateMoving   = "moving"
	StateAttached = "attached"
)

// Record is one attachment of an RDMA device to a pod.
type Record struct {
	Version int `json:"version"`
	Key
	Netns string `json:"netns"`
	// NetnsDev and NetnsIno identify the pod netns as it was at ADD: a
	// path such as /proc/PID/ns/net can later open another netns, whose
	// devices this record must never claim. Zero in older records.
	NetnsDev   uint64 `json:"netnsDev,omitempty"`
	NetnsIno   uint64 `json:"netnsIno,omitempty"`
	Device     string `json:"rdmaDevice"`
	PodName    string `json:"podDevName,omitempty"`
	DevPath    string `json:"devPath,omitempty"`
	PCIAddress string `json:"pciAddress,omitempty"`
	Rule       string `json:"rule,omitempty"`
	// HostNetdev is the name the attachment's NIC had in the host, as
	// host-device stored it in the link's alias at ADD, and NetdevParent
	// the device behind the NIC as the kernel names it ("pci/0000:3b:00.0",
	// "virtio/virtio1"). DEL gives the pod's link that alias back before
	// host-device renames the link by it, finding the link by its parent:
	// the pod can change both its name and its alias. Empty in older
	// records, and NetdevParent on kernels before 5.14.
	HostNetdev   string `json:"hostNetdev,omitempty"`
	NetdevParent string `json:"netdevParent,omitempty"`
	State        string `json:"state"`
	// HostLink is the NIC's IP configuration in the host before ADD,
	// when its claim carried the host's addresses into the pod: DEL gives
	// it back once the NIC is home.
	HostLink *linkconf.Config `json:"hostLink,omitempty"`
	// QoS is set when rdmaQoS was applied, so DEL knows to clean it up.
	QoS bool `json:"qos,omitempty"`
	// K8sNamespace and K8sPod are the pod the runtime named in CNI_ARGS,
	// for the exporter's labels and the doctor's reports.
	K8sNamespace string    `json:"k8sNamespace,omitempty"`
	K8sPod       string    `json:"k8sPod,omitempty"`
	Created      time.Time `json:"created"`
}

var (
	// ErrNotFound is returned (wrapped) when no record exists.
	ErrNotFound = errors.New("no rdma-netns state record")
	// ErrCorrupt is matched by every *CorruptError.
	ErrCorrupt = errors.New("corrupt rdma-netns state record")
)

// CorruptError describes a record file that cannot be trusted. It matches
// ErrCorrupt with errors.Is.
type CorruptError struct {
	Path string // empty when the data did not come from a file
	Err  error
}

func (e *CorruptError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%v: %v", ErrCorrupt, e.Err)
	}
	return fmt.Sprintf("%v %s: %v; if no pod uses the device named in it, remove the file", ErrCorrupt, e.Path, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// maxRecordSize bounds what we read; a real record is a few hundred bytes
// and anything huge is not ours.
const maxRecordSize = 64 << 10

// DecodeRecord parses and validates a record. Unknown JSON fields are
// ignored so that a rollback to an older plugin can still read records that
// gained optional fields; incompatible changes must bump SchemaVersion.
func DecodeRecord(data []byte) (*Record, error) {
	if len(data) > maxRecordSize {
		return nil, &CorruptError{Err: fmt.Errorf("%d bytes, larger than the %d byte limit", len(data), maxRecordSize)}
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, &CorruptError{Err: fmt.Errorf("invalid JSON: %w", err)}
	}
	if r.Version != SchemaVersion {
		return nil, &CorruptError{Err: fmt.Errorf("schema version %d, this plugin understands only %d", r.Version, SchemaVersion)}
	}
	if err := r.validate(); err != nil {
		return nil, &CorruptError{Err: err}
	}
	return &r, nil
}

// encode is the inverse of DecodeRecord: indented JSON and a newline, the
// layout of every build so far. '<', '>' and '&' are written as they are,
// byte for byte what the previous builds wrote (TestRecordFilesOfEarlier
// Builds); the escaped form of the earliest builds decodes the same.
func (r *Record) encode() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("encoding state record for %s: %w", r.Key, err)
	}
	return b.Bytes(), nil
}

// validate is shared by Put and DecodeRecord, so whatever Put accepts reads
// back, and whatever reads back could have been written by Put.
func (r *Record) validate() error {
	if err := r.Key.Validate(); err != nil {
		return err
	}
	if err := ValidateDeviceName(r.Device); err != nil {
		return err
	}
	if r.PodName != "" {
		if err := ValidateDeviceName(r.PodName); err != nil {
			return fmt.Errorf("pod device name: %w", err)
		}
	}
	if r.HostNetdev != "" {
		if err := ValidateIfName(r.HostNetdev); err != nil {
			return fmt.Errorf("host netdev: %w", err)
		}
	}
	if r.Netns == "" {
		return errors.New("netns path is empty")
	}
	for _, f := range []struct{ what, v string }{
		{"netns path", r.Netns},
		{"device path", r.DevPath},
		{"PCI address", r.PCIAddress},
		{"rule", r.Rule},
		{"netdev parent", r.NetdevParent},
		{"pod namespace", r.K8sNamespace},
		{"pod name", r.K8sPod},
	} {
		if err := validateText(f.what, f.v); err != nil {
			return err
		}
	}
	if r.State != StateMoving && r.State != StateAttached {
		return fmt.Errorf("invalid state %q: must be %q or %q", r.State, StateMoving, StateAttached)
	}
	return nil
}
