package state

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	// MaxNameLen bounds network names and container IDs. 253 is the
	// Kubernetes DNS-subdomain limit; nothing legitimate is longer, and the
	// bound keeps records and error messages small.
	MaxNameLen = 253
	// MaxIfNameLen is IFNAMSIZ-1: the kernel rejects longer netdev names.
	MaxIfNameLen = 15
	// MaxDeviceNameLen is IB_DEVICE_NAME_MAX-1: the RDMA core rejects longer
	// device names.
	MaxDeviceNameLen = 63
)

// Key identifies one attachment the way CNI does: a container may be attached
// to several networks, and to one network several times under different
// interface names.
type Key struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// String is for messages only; it is not the file name (see fileName).
func (k Key) String() string {
	return k.Network + "/" + k.ContainerID + "/" + k.IfName
}

// Validate enforces the same rules libcni applies to CNI_CONTAINERID,
// the network name and CNI_IFNAME, plus length limits. Any runtime that
// goes through libcni already satisfies them, so rejecting everything else
// costs nothing and keeps hostile bytes out of the state directory and logs.
func (k Key) Validate() error {
	if err := k.ValidateRuntime(); err != nil {
		return err
	}
	return ValidateIfName(k.IfName)
}

// ValidateRuntime checks the parts of the key the runtime and the network's
// configuration choose, the network name and the container ID; a pod may
// choose the interface name (Multus's network-selection "interface").
func (k Key) ValidateRuntime() error {
	if err := validateCNIName("network name", k.Network); err != nil {
		return err
	}
	return validateCNIName("container ID", k.ContainerID)
}

// validateCNIName implements the CNI spec rule for container IDs and network
// names: ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$. It excludes '/', NUL, control
// characters and whitespace, and because the first character cannot be '.',
// also "." and "..", so no value can act as a path component.
func validateCNIName(what, s string) error {
	if s == "" {
		return fmt.Errorf("invalid %s: must not be empty", what)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("invalid %s %.40q...: %d bytes, at most %d allowed", what, s, len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if alnum || i > 0 && (c == '_' || c == '.' || c == '-') {
			continue
		}
		return fmt.Errorf("invalid %s %q: must start with a letter or digit and contain only letters, digits, '_', '.' and '-' (CNI spec)", what, s)
	}
	return nil
}

// ValidateIfName applies the kernel's dev_valid_name rules (as libcni does)
// and additionally rejects control characters and invalid UTF-8, which the
// kernel would accept but which cannot round-trip through JSON unchanged.
func ValidateIfName(name string) error {
	return validateDevName("interface name", name, MaxIfNameLen, true)
}

// ValidatePlainIfName is the rule ADD holds a pod's interface name to
// before it records one: 1 to 15 letters, digits, '-', '_' and '.', not
// starting with '-'. The pod chooses the name, and the node's operators
// meet it in logs, records and what the doctor prints, where a ';', a
// quote or a backquote is a shell's business; a leading '-' makes a
// command that takes the name as an argument (ethtool, grep) read an
// option, however it is quoted. "." and ".." the kernel refuses, and
// ValidateIfName with it. Records keep ValidateIfName, so those an older
// ADD wrote under other names still load and their pods are deleted.
func ValidatePlainIfName(name string) error {
	if err := ValidateIfName(name); err != nil {
		return err
	}
	if name[0] == '-' {
		return fmt.Errorf("invalid interface name %q: must not start with '-'", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("invalid interface name %q: %q is not a letter, digit, '-', '_' or '.'", name, r)
		}
	}
	return nil
}

// ValidateDeviceName checks an RDMA device name as recorded in the state.
// The RDMA core allows up to 63 bytes and, like netdevs, no '/'.
func ValidateDeviceName(name string) error {
	return validateDevName("RDMA device name", name, MaxDeviceNameLen, false)
}

func validateDevName(what, name string, maxLen int, noColon bool) error {
	if name == "" {
		return fmt.Errorf("invalid %s: must not be empty", what)
	}
	if len(name) > maxLen {
		return fmt.Errorf("invalid %s %.40q...: %d bytes, at most %d allowed", what, name, len(name), maxLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("invalid %s %q", what, name)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("invalid %s %q: not valid UTF-8", what, name)
	}
	for _, r := range name {
		if r == '/' || noColon && r == ':' || unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("invalid %s %q: must not contain '/', whitespace or control characters", what, name)
		}
	}
	return nil
}

// maxTextLen is PATH_MAX; the free-form fields hold paths at most.
const maxTextLen = 4096

// validateText keeps free-form fields printable and bounded so a record is
// safe to log and survives a JSON round trip byte for byte.
func validateText(what, s string) error {
	if len(s) > maxTextLen {
		return fmt.Errorf("invalid %s: %d bytes, at most %d allowed", what, len(s), maxTextLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("invalid %s %q: not valid UTF-8", what, s)
	}
	if strings.ContainsFunc(s, unicode.IsControl) {
		return fmt.Errorf("invalid %s %q: contains control characters", what, s)
	}
	return nil
}

// fileName maps a key to its record file. The parts are joined with NUL,
// which Validate guarantees none of them contains, so the encoding is
// injective; hashing keeps the name well under NAME_MAX (two 253-byte
// parts would not fit) and free of any character that matters to a shell.
// The key is stored inside the file as well, so List can return keys and a
// file whose content does not hash to its name is detected as corrupt.
func (k Key) fileName() string {
	sum := sha256.Sum256([]byte(k.Network + "\x00" + k.ContainerID + "\x00" + k.IfName))
	return hex.EncodeToString(sum[:]) + recordSuffix
}

const recordSuffix = ".json"

// isRecordFileName reports whether name has the shape fileName produces,
// so List skips the lock file, temp files and anything an operator left.
func isRecordFileName(name string) bool {
	hexPart, ok := strings.CutSuffix(name, recordSuffix)
	if !ok || len(hexPart) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(hexPart); i++ {
		c := hexPart[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func compareKeys(a, b Key) int {
	return cmp.Or(
		strings.Compare(a.Network, b.Network),
		strings.Compare(a.ContainerID, b.ContainerID),
		strings.Compare(a.IfName, b.IfName),
	)
}
