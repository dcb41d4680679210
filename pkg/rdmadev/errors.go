package rdmadev

import (
	"fmt"
	"strings"
)

// NoMatchError says that no RDMA device in the host's sysfs belongs to a
// netdev. Its message is meant to be returned to the runtime verbatim, and
// so to the pod's events: it names no other device of the node (Describe
// of Have is for the node's log).
type NoMatchError struct {
	// What names the netdev, e.g. `netdev "net1"`.
	What string
	// DevPath is the netdev's parent device.
	DevPath string
	// Have is every RDMA device the host has, to let the operator see
	// which one was expected.
	Have []Device
}

// NoMatch returns a *NoMatchError. what is a noun phrase naming the netdev,
// e.g. `netdev "net1"` or `netdev "net1" (deviceID 0000:3b:00.2)`.
func NoMatch(what, devPath string, have []Device) error {
	return &NoMatchError{What: what, DevPath: devPath, Have: have}
}

func (e *NoMatchError) Error() string {
	return fmt.Sprintf("no RDMA device found for %s (parent device %s); "+
		`set "rdmaDevice" to name it, check that the RDMA driver for this device is loaded (e.g. mlx5_ib, irdma, rdma_rxe), `+
		"or it may already be in another pod's network namespace; the node's log of rdma-netns lists the RDMA devices the host has",
		e.What, e.DevPath)
}

// AmbiguousError says that several RDMA devices are equally near a netdev,
// so guessing could move the wrong one.
type AmbiguousError struct {
	What    string
	Matches []Match
}

// Ambiguous returns an *AmbiguousError; what is as for NoMatch.
func Ambiguous(what string, matches []Match) error {
	return &AmbiguousError{What: what, Matches: matches}
}

func (e *AmbiguousError) Error() string {
	cands := make([]string, 0, len(e.Matches))
	for _, m := range e.Matches {
		cands = append(cands, fmt.Sprintf("%s (%s)", m.Device.Name, m.Relation))
	}
	return fmt.Sprintf(`%d RDMA devices are equally close to %s: %s; set "rdmaDevice" to the one to move into the pod`,
		len(e.Matches), e.What, strings.Join(cands, ", "))
}

// Describe lists devs with their PCI functions or parents, for logs.
func Describe(devs []Device) string {
	if len(devs) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(devs))
	for _, d := range devs {
		switch {
		case d.PCIAddress != "":
			parts = append(parts, fmt.Sprintf("%s (PCI %s)", d.Name, d.PCIAddress))
		case d.DevPath != "":
			parts = append(parts, fmt.Sprintf("%s (no PCI function, parent %s)", d.Name, d.DevPath))
		default:
			parts = append(parts, fmt.Sprintf("%s (parent device unknown)", d.Name))
		}
	}
	return strings.Join(parts, ", ")
}
