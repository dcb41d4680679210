package rdmadev

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Match is an RDMA device found near a netdev's parent device.
type Match struct {
	Device Device
	// Distance counts steps through the device tree; 0 means the RDMA
	// device's parent is the netdev's parent device itself.
	Distance int
	// Relation says in words where the RDMA device sits, for logs and
	// error messages.
	Relation string
}

// Closest returns the RDMA devices of devs nearest to the device at devPath
// (the netdev's parent device, resolved like Device.DevPath); several results
// only when they are equally near, sorted by name. An empty result means no
// match.
//
// Devices whose parent is devPath or one of its descendants win over all
// others, nearest first. This is what keeps a PF netdev on the PF's own
// mlx5_0 (distance 0) rather than a sub-function's mlx5_2 below it
// (distance 1), and an SF netdev on its mlx5_2 (distance 0) rather than the
// PF's mlx5_0 above it.
//
// Only when nothing sits at or below devPath are devices elsewhere under the
// PCI function enclosing devPath considered, at distance "steps up to that
// function + steps down to the device's parent". Drivers attach the RDMA
// device to the PCI function while the netdev hangs off a child (virtio1
// for soft-RoCE on virtio). pciFunc names that function: its PCI address as
// PCIAddressOf returns it (matched against devPath's ancestors), or its
// absolute path. Pass "" to disable this fallback, e.g. when devPath is a
// sub-function whose RDMA device, if absent, has left the host and must not
// be replaced by the PF's. Devices outside the function never match: an
// SR-IOV VF is a sibling of its PF, so it never gets the PF's device.
func Closest(devPath, pciFunc string, devs []Device) []Match {
	if devPath == "" {
		return nil
	}
	devPath = filepath.Clean(devPath)
	parentName := filepath.Base(devPath)

	near := under(devPath, devs, 0, func(rel string, down int) string {
		if down == 0 {
			return directRelation(parentName)
		}
		return fmt.Sprintf("under %s, %s below the netdev's parent device %s", rel, levels(down), parentName)
	})
	if len(near) > 0 {
		return nearest(near)
	}

	fn, ok := enclosingFunction(devPath, pciFunc)
	if !ok {
		return nil
	}
	_, up, _ := below(fn, devPath)
	fnName := filepath.Base(fn)
	return nearest(under(fn, devs, up, func(rel string, down int) string {
		if down == 0 {
			return fmt.Sprintf("under PCI function %s enclosing %s", fnName, parentName)
		}
		return fmt.Sprintf("under %s in PCI function %s enclosing %s", rel, fnName, parentName)
	}))
}

// under matches the devices below dir, each at distance from plus its
// depth there, with the relation that names where it is (rel: its path
// below dir).
func under(dir string, devs []Device, from int, relation func(rel string, down int) string) []Match {
	var out []Match
	for _, d := range devs {
		if rel, down, ok := below(dir, d.DevPath); ok {
			out = append(out, Match{Device: d, Distance: from + down, Relation: relation(rel, down)})
		}
	}
	return out
}

func directRelation(parentName string) string {
	return fmt.Sprintf("directly under the netdev's parent device %s", parentName)
}

// Direct is Closest's answer, when there is exactly one RDMA device right
// under devPath, found without listing every RDMA device on the node: one
// directory read of devPath's infiniband directory, which, like
// class/infiniband, shows only the devices in the host netns. ok is false
// when there is none or several there, or devPath cannot be read; Closest
// then decides.
func (s Sysfs) Direct(devPath string) (m Match, ok bool) {
	if devPath == "" {
		return Match{}, false
	}
	devPath = filepath.Clean(devPath)
	entries, err := os.ReadDir(filepath.Join(devPath, "infiniband"))
	if err != nil || len(entries) != 1 {
		return Match{}, false
	}
	d := Device{Name: entries[0].Name(), DevPath: devPath, PCIAddress: s.PCIAddressOf(devPath)}
	return Match{Device: d, Relation: directRelation(filepath.Base(devPath))}, true
}

// below reports whether p is anc or lies under it, the path from anc to p
// and how many levels down that is. It compares whole path elements so
// that 0000:3b:00.1 is not taken to be under 0000:3b:00.
func below(anc, p string) (rel string, depth int, ok bool) {
	if p == "" {
		return "", 0, false
	}
	p = filepath.Clean(p)
	if p == anc {
		return "", 0, true
	}
	prefix := strings.TrimSuffix(anc, string(filepath.Separator)) + string(filepath.Separator)
	if !strings.HasPrefix(p, prefix) {
		return "", 0, false
	}
	rel = p[len(prefix):]
	return rel, strings.Count(rel, string(filepath.Separator)) + 1, true
}

// enclosingFunction finds the PCI function's directory among devPath and
// its ancestors. Matching by name is safe here because the caller got
// pciFunc from the subsystem link of one of these very directories.
func enclosingFunction(devPath, pciFunc string) (string, bool) {
	if pciFunc == "" {
		return "", false
	}
	if filepath.IsAbs(pciFunc) {
		fn := filepath.Clean(pciFunc)
		_, _, ok := below(fn, devPath)
		return fn, ok
	}
	for dir := devPath; ; dir = filepath.Dir(dir) {
		if strings.EqualFold(filepath.Base(dir), pciFunc) {
			return dir, true
		}
		if dir == filepath.Dir(dir) {
			return "", false
		}
	}
}

// nearest keeps the matches at the smallest distance, sorted by name.
func nearest(ms []Match) []Match {
	if len(ms) == 0 {
		return nil
	}
	best := slices.MinFunc(ms, func(a, b Match) int { return a.Distance - b.Distance }).Distance
	ms = slices.DeleteFunc(ms, func(m Match) bool { return m.Distance != best })
	slices.SortFunc(ms, func(a, b Match) int { return strings.Compare(a.Device.Name, b.Device.Name) })
	return ms
}

func levels(n int) string {
	if n == 1 {
		return "1 level"
	}
	return fmt.Sprintf("%d levels", n)
}
