package doctor

import (
	"fmt"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/state"
	"path/filepath"
)

// RecordView is one attachment record and what became of it.
type RecordView struct {
	Key       string `json:"key"`
	Netns     string `json:"netns"`
	Device    string `json:"device"`
	PodName   string `json:"podDevName,omitempty"`
	State     string `json:"state"`
	File      string `json:"file"`
	NetnsGone bool   `json:"netnsGone"`
	// Status is "ok", "moving", "drift", "vanished" or "stale".
	Status string `json:"status"`
}

// lostNameFindings reports host devices that a DEL without a record
// returned under their pod-side name.
func lostNameFindings(fs *Findings, e *Env, devs []Device) {
	st, err := state.Open(e.StateDir)
	if err != nil {
		return
	}
	notes, _ := st.LostNames()
	for _, d := range devs {
		if note, ok := notes[d.Name]; ok && d.Location.Host {
			fs.add(Warn, "lost-host-name", d.Name, note,
				fmt.Sprintf("rename it to the name the driver gives it (as on the node's other devices), then delete %s", filepath.Join(e.StateDir, state.RenamedDir, d.Name)))
		}
	}
}

// Classify compares the attachment records with where the devices are,
// by the inventory's rule. identify resolves a recorded netns path; file
// names a record's file for remedies. It returns a view of each record,
// the findings, and the record holding each device (by host name and by
// pod-side name): only live claims hold devices.
func Classify(recs []*state.Record, snap *inventory.Snapshot, shared bool, identify func(string) (inventory.NetnsID, error), file func(state.Key) string) ([]RecordView, []Finding, map[string]*state.Record) {
	views := []RecordView{}
	var fs []Finding
	owners := map[string]*state.Record{}
	add := func(sev Severity, check, subject, reason, remedy string) {
		fs = append(fs, Finding{Severity: sev, Check: check, Subject: subject, Reason: reason, Remedy: remedy})
	}
	for _, rec := range recs {
		v := RecordView{Key: rec.Key.String(), Netns: rec.Netns, Device: rec.Device, PodName: rec.PodName, State: rec.State, File: file(rec.Key)}
		subj := rec.Key.String()
		name := rec.InPod()
		verdict, where := snap.Judge(rec, identify)
		if shared && verdict == inventory.Returned {
			// Shared mode: every device is in the host and every pod.
			verdict = inventory.Held
		}
		v.NetnsGone = verdict == inventory.NetnsGone
		switch {
		case verdict == inventory.NetnsGone:
			v.Status = "stale"
			at := "it is nowhere on the node"
			switch ns, host := snap.Where(name); {
			case host:
				at = "the device is back in the host"
			case where != nil:
				at = "the device is in netns " + where.Path
			case ns != nil:
				at = "the device is in netns " + ns.Path
			}
			add(Warn, "stale-record", subj,
				fmt.Sprintf("the record of RDMA device %s names pod netns %s, which no longer exists (or is another netns now); %s. It blocks nothing: the next ADD on this node removes it", name, rec.Netns, at),
				fmt.Sprintf("nothing to do; the runtime's DEL or GC of that pod removes it too, or delete %s", v.File))
		case verdict == inventory.Missing:
			v.Status = "vanished"
			add(Fail, "drift", subj,
				fmt.Sprintf("RDMA device %s is recorded in netns %s but no netns on the node has it: its driver was unbound or the device removed", name, rec.Netns),
				"check the NIC and its RDMA driver (dmesg, rdma dev); delete and recreate the pod once the device is back")
		case verdict == inventory.Held:
			owners[rec.Device] = rec
			owners[name] = rec
			if rec.State == state.StateAttached {
				v.Status = "ok"
				add(OK, "record", subj, fmt.Sprintf("RDMA device %s is in netns %s as recorded", name, rec.Netns), "")
			} else {
				v.Status = "moving"
				add(Warn, "record", subj, fmt.Sprintf("RDMA device %s is in netns %s but its ADD did not finish (state %q)", name, rec.Netns, rec.State),
					"the runtime retries ADD or runs DEL for that pod; if neither happens, delete and recreate the pod")
			}
		case verdict == inventory.Returned && rec.State == state.StateMoving:
			v.Status = "moving"
			add(Warn, "record", subj, fmt.Sprintf("an ADD of RDMA device %s into netns %s was interrupted before the device moved; the device is free", name, rec.Netns),
				"the runtime retries ADD or runs DEL for that pod; either clears this, and so does any other ADD on this node")
		default:
			v.Status = "drift"
			at := "host"
			if where != nil {
				at = "netns " + where.Path
			}
			add(Fail, "drift", subj,
				fmt.Sprintf("RDMA device %s is recorded in netns %s but it is in %s: something moved it (rdma dev set, a driver reload) and the pod has lost it", name, rec.Netns, at),
				"delete and recreate the pod (its CHECK fails); DEL cleans the record up")
		}
		views = append(views, v)
	}
	return views, fs, owners
}

// Leaks reports devices outside the host netns that no record owns.
func Leaks(devs []Device, owners map[string]*state.Record) []Finding {
	var fs []Finding
	for _, d := range devs {
		if d.Location.Host || d.Location.Shared || owners[d.Name] != nil {
			continue
		}
		fs = append(fs, Finding{
			Severity: Warn, Check: "leak", Subject: d.Name,
			Reason: fmt.Sprintf("RDMA device %s sits in netns %s, but no rdma-netns record owns it: no pod will get it from rdma-netns", d.Name, d.Location.Netns),
			Remedy: "if nothing put it there on purpose (another CNI plugin, a person), move it back, or delete that network namespace (its devices return to the host); " +
				moveBackCommand(d.Name, d.Location.Netns),
		})
	}
	return fs
}

// moveBackCommand is the iproute2 command returning dev from the netns at
// nsPath, each name quoted for the shell; `rdma dev set` takes only names
// under /run/netns, so the host netns gets one first. It ends the fix, so
// the command runs to the end of the line.
func moveBackCommand(dev, nsPath string) string {
	if !pasteable(dev, nsPath) {
		return notPasteable
	}
	enter := "nsenter --net=" + shellWord(nsPath)
	if dir, name := filepath.Split(nsPath); dir == "/run/netns/" || dir == "/var/run/netns/" {
		enter = "ip netns exec " + shellWord(name)
	}
	return fmt.Sprintf("to move it back: ip netns attach host 1; %s rdma dev set %s netns host", enter, shellWord(dev))
}
