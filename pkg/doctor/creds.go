package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// capDACOverride is CAP_DAC_OVERRIDE's bit in the capability sets.
const capDACOverride = 1

// Creds are what the kernel checks a process's open of a file against:
// its filesystem uid and gids as the node numbers them, CAP_DAC_OVERRIDE,
// and the ID maps of its user namespace, which decide whether that
// capability counts for a file.
type Creds struct {
	// Known is false when /proc/PID/status could not be read.
	Known  bool     `json:"known"`
	FSUID  uint32   `json:"fsuid"`
	FSGID  uint32   `json:"fsgid"`
	Groups []uint32 `json:"groups,omitempty"`
	// DACOverride: CAP_DAC_OVERRIDE is in the effective set.
	DACOverride bool `json:"dacOverride"`
	// UIDMap and GIDMap are /proc/PID/uid_map and gid_map as the node
	// reads them; UserNS is set when they are not the node's own (the
	// identity of every ID), as for a pod with hostUsers: false.
	UIDMap []IDRange `json:"uidMap,omitempty"`
	GIDMap []IDRange `json:"gidMap,omitempty"`
	UserNS bool      `json:"userns"`
}

// IDRange is one line of an ID map: Count IDs from Inside in the process's
// user namespace are Outside onwards on the node.
type IDRange struct {
	Inside  uint32 `json:"inside"`
	Outside uint32 `json:"outside"`
	Count   uint32 `json:"count"`
}

// DevNode is a /dev/infiniband node as a process sees it: who owns it
// and its permission bits, on the node's numbering.
type DevNode struct {
	Name string      `json:"name"`
	UID  uint32      `json:"uid"`
	GID  uint32      `json:"gid"`
	Perm os.FileMode `json:"perm"`
}

func (n DevNode) String() string {
	return fmt.Sprintf("/dev/infiniband/%s (owner %d:%d, mode %04o)", n.Name, n.UID, n.GID, uint32(n.Perm))
}

// ParseCreds reads the Uid, Gid, Groups and CapEff lines of a
// /proc/PID/status and the process's uid_map and gid_map.
func ParseCreds(status, uidMap, gidMap string) (Creds, error) {
	var c Creds
	fields := map[string][]string{}
	for _, l := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			fields[k] = strings.Fields(v)
		}
	}
	// Real, effective, saved and filesystem IDs: open checks the last.
	uid, gid := fields["Uid"], fields["Gid"]
	if len(uid) != 4 || len(gid) != 4 {
		return c, fmt.Errorf("no Uid and Gid lines of four IDs")
	}
	var err error
	if c.FSUID, err = parseID(uid[3]); err != nil {
		return c, err
	}
	if c.FSGID, err = parseID(gid[3]); err != nil {
		return c, err
	}
	for _, g := range fields["Groups"] {
		id, err := parseID(g)
		if err != nil {
			return c, err
		}
		c.Groups = append(c.Groups, id)
	}
	set, err := ParseCapEff(status)
	if err != nil {
		return c, err
	}
	c.DACOverride = HasCap(set, capDACOverride)
	if c.UIDMap, err = parseIDMap(uidMap); err != nil {
		return c, fmt.Errorf("uid_map: %v", err)
	}
	if c.GIDMap, err = parseIDMap(gidMap); err != nil {
		return c, fmt.Errorf("gid_map: %v", err)
	}
	c.UserNS = !identity(c.UIDMap) || !identity(c.GIDMap)
	c.Known = true
	return c, nil
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("bad ID %q", s)
	}
	return uint32(n), nil
}

func parseIDMap(s string) ([]IDRange, error) {
	var m []IDRange
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("line %q is not INSIDE OUTSIDE COUNT", l)
		}
		var r [3]uint32
		for i := range f {
			n, err := strconv.ParseUint(f[i], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("line %q: %v", l, err)
			}
			r[i] = uint32(n)
		}
		m = append(m, IDRange{Inside: r[0], Outside: r[1], Count: r[2]})
	}
	return m, nil
}

// identity: the map of the node's own user namespace, every ID itself.
func identity(m []IDRange) bool {
	return len(m) == 1 && m[0] == IDRange{Inside: 0, Outside: 0, Count: ^uint32(0)}
}

// inspectCreds reads a process's Creds and the owner and mode of each
// node in its /dev/infiniband (root: /proc/PID/root).
func inspectCreds(dir, status string, names []string) (Creds, []DevNode) {
	uidMap, err1 := os.ReadFile(filepath.Join(dir, "uid_map"))
	gidMap, err2 := os.ReadFile(filepath.Join(dir, "gid_map"))
	var c Creds
	if err1 == nil && err2 == nil {
		c, _ = ParseCreds(status, string(uidMap), string(gidMap))
	}
	var nodes []DevNode
	for _, name := range names {
		fi, err := os.Stat(filepath.Join(dir, "root", "dev", "infiniband", name))
		if err != nil {
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		nodes = append(nodes, DevNode{Name: name, UID: st.Uid, GID: st.Gid, Perm: fi.Mode().Perm()})
	}
	return c, nodes
}

// ParseCapEff returns the effective capability set from the contents of
// /proc/PID/status.
func ParseCapEff(status string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed CapEff %q", rest)
		}
		return v, nil
	}
	return 0, errors.New("no CapEff line")
}

// HasCap reports whether capability bit c is in set.
func HasCap(set uint64, c uint) bool { return c < 64 && set&(1<<c) != 0 }
