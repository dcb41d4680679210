package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Severity grades a finding. Only Fail makes the exit status non-zero:
// warnings are things that may bite later or that a person should look at,
// but nothing is known to be broken.
type Severity string

const (
	OK   Severity = "ok"
	Warn Severity = "warn"
	Fail Severity = "fail"
)

// Finding is one answer of the doctor: what was checked, about what, how
// it went, why, and what to do about it.
type Finding struct {
	Severity Severity `json:"severity"`
	// Check names the kind of check, e.g. "netns-mode", "leak", "memlock".
	Check string `json:"check"`
	// Subject is what the check is about: a device, a process, the node.
	Subject string `json:"subject,omitempty"`
	Reason  string `json:"reason"`
	Remedy  string `json:"remedy,omitempty"`
}

// Report is everything one run found. Node is set for the node view, Pod
// for the pod view, NADs for `doctor nads`.
type Report struct {
	Node     *NodeView `json:"node,omitempty"`
	Pod      *PodView  `json:"pod,omitempty"`
	NADs     *NADsView `json:"nads,omitempty"`
	Findings []Finding `json:"findings"`
	// Summary counts the findings by severity.
	Summary map[Severity]int `json:"summary"`
	// ExitCode is what the command exits with: 1 when anything failed.
	ExitCode int `json:"exitCode"`
}

func (r *Report) add(sev Severity, check, subject, reason, remedy string) {
	r.Findings = append(r.Findings, Finding{Severity: sev, Check: check, Subject: subject, Reason: reason, Remedy: remedy})
}

// finish fills Summary and ExitCode from the findings.
func (r *Report) finish() {
	r.Summary = map[Severity]int{OK: 0, Warn: 0, Fail: 0}
	r.ExitCode = 0
	for _, f := range r.Findings {
		r.Summary[f.Severity]++
		if f.Severity == Fail {
			r.ExitCode = 1
		}
	}
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a person: the views as aligned tables,
// then the findings, worst first within their original order. Every value
// goes through termText, which escapes it for the terminal.
func (r *Report) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	t := termText{b}
	if r.Node != nil {
		writeNode(t, r.Node)
	}
	if r.Pod != nil {
		writePod(t, r.Pod)
	}
	if r.NADs != nil {
		writeNADs(t, r.NADs)
	}
	t.printf("Findings\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	tt := termText{tw}
	for _, sev := range []Severity{Fail, Warn, OK} {
		for _, f := range r.Findings {
			if f.Severity != sev {
				continue
			}
			subj := f.Subject
			if subj == "" {
				subj = "-"
			}
			tt.printf("  %s\t%s\t%s\t%s\n", strings.ToUpper(string(f.Severity)), f.Check, subj, f.Reason)
			if f.Remedy != "" {
				tt.printf("  \t\t\tfix: %s\n", f.Remedy)
			}
		}
	}
	tw.Flush()
	t.printf("\n%d ok, %d warning(s), %d failure(s); exit status %d\n",
		r.Summary[OK], r.Summary[Warn], r.Summary[Fail], r.ExitCode)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeNode(t termText, n *NodeView) {
	t.printf("RDMA subsystem\n")
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	tt := termText{tw}
	mode := n.NetnsMode
	if mode == "" {
		mode = "unavailable"
		if n.ModeError != "" {
			mode += " (" + n.ModeError + ")"
		}
	}
	tt.printf("  netns mode\t%s\n", mode)
	persist := "not configured"
	if n.Persistent != "" {
		persist = n.Persistent
	}
	tt.printf("  persistent setting\t%s\n", persist)
	if n.StateDirPresent {
		tt.printf("  state directory\t%s (%d record(s))\n", n.StateDir, len(n.Records))
	} else {
		tt.printf("  state directory\t%s (not present)\n", n.StateDir)
	}
	tw.Flush()
	t.printf("\nRDMA devices\n")
	if len(n.Devices) == 0 {
		t.printf("  none\n")
	} else {
		writeDevices(t, n.Devices, true)
	}
	t.printf("\n")
}

func writeDevices(t termText, devs []Device, withLocation bool) {
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	tt := termText{tw}
	hdr := "  DEVICE\tDRIVER\tPCI\tPORT\tSTATE\tNETDEV\tGIDS\tCHAR DEVICES"
	if withLocation {
		hdr += "\tLOCATION"
	}
	tt.printf(hdr + "\n")
	for _, d := range devs {
		ports := d.Ports
		if len(ports) == 0 {
			ports = []Port{{}}
		}
		for i, p := range ports {
			name, driver, pci, chars, loc := d.Name, dash(d.Driver), dash(d.PCIAddress), dash(strings.Join(baseNames(d.CharDevices), " ")), d.Location.String()
			if i > 0 {
				name, driver, pci, chars, loc = "", "", "", "", ""
			}
			port := "-"
			if p.Port != 0 {
				port = fmt.Sprint(p.Port)
			}
			gids := "-"
			if p.Port != 0 {
				gids = fmt.Sprint(p.GIDs)
			}
			cells := []any{name, driver, pci, port, dash(p.State), dash(strings.Join(p.Netdevs, ",")), gids, chars}
			format := "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s"
			if withLocation {
				cells = append(cells, loc)
				format += "\t%s"
			}
			tt.printf(format+"\n", cells...)
		}
	}
	tw.Flush()
}

func writePod(t termText, p *PodView) {
	t.printf("Pod network namespace %s (inode %d)\n", p.Netns, p.Inode)
	t.printf("\nRDMA devices in it\n")
	if len(p.Devices) == 0 {
		t.printf("  none\n")
	} else {
		writeDevices(t, p.Devices, false)
	}
	if len(p.Rails) > 0 {
		t.printf("\nRails\n")
		writeRails(t, p.Rails)
	}
	t.printf("\nProcesses in it\n")
	if len(p.Processes) == 0 {
		t.printf("  none\n")
	} else {
		tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
		tt := termText{tw}
		want := p.VerbsNodes
		tt.printf("  PID\tCOMMAND\tMEMLOCK (soft)\tCAP_IPC_LOCK\t/dev/shm\t/dev/infiniband\n")
		for _, pr := range p.Processes {
			ipc := "no"
			if pr.CapIPCLock {
				ipc = "yes"
			}
			tt.printf("  %d\t%s\t%s\t%s\t%s\t%s\n", pr.PID, pr.Comm, pr.Memlock.String(), ipc, pr.ShmString(), charSummary(pr.CharDevices, want))
		}
		tw.Flush()
	}
	t.printf("\n")
}

func writeNADs(t termText, v *NADsView) {
	t.printf("NetworkAttachmentDefinitions: %d read, %d with rdma-netns\n", v.Read, len(v.WithRdmaNetns))
	if len(v.WithRdmaNetns) == 0 {
		t.printf("\n")
		return
	}
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	tt := termText{tw}
	tt.printf("  NAD\tCHAIN\tRESOURCE\tRDMADEVNAME\tPOD NAME PREFIX\tALLOWED POD DEVICES\n")
	for _, n := range v.WithRdmaNetns {
		ref := nadRef{n.Namespace, n.Name}
		tt.printf("  %s\t%s\t%s\t%s\t%s\t%s\n", ref, chainString(n.Chain), dash(n.ResourceName),
			dash(n.RdmaDevName), dash(n.PodRdmaDevNamePrefix), dash(strings.Join(n.AllowedPodDevices, ",")))
	}
	tw.Flush()
	t.printf("\n")
}

// chainString shows a chain as "host-device[deviceID] > rdma-netns".
func chainString(chain []ChainPlugin) string {
	parts := make([]string, 0, len(chain))
	for _, p := range chain {
		s := dash(p.Type)
		if p.DeviceID {
			s += "[deviceID]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " > ")
}

// writeRails shows one line per address of each rail: its RoCE v2 GID,
// the ARP settings the kernel applies, and for rails sharing a subnet the
// netdev the route to a peer leaves by.
func writeRails(t termText, rails []Rail) {
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	tt := termText{tw}
	tt.printf("  DEVICE\tPORT\tNETDEV\tADDRESS\tROCE V2 GID\tARP IGNORE/ANNOUNCE\tSHARES SUBNET WITH\tROUTE TO PEER\n")
	for _, rl := range rails {
		arp := fmt.Sprintf("%s/%s", conf(rl.ArpIgnore), conf(rl.ArpAnnounce))
		shares := dash(strings.Join(rl.SharesSubnetWith, ","))
		addrs := rl.Addresses
		if len(addrs) == 0 {
			addrs = []RailAddress{{}}
		}
		for i, a := range addrs {
			dev, port, nd := rl.Device, fmt.Sprint(rl.Port), rl.Netdev
			if i > 0 {
				dev, port, nd = "", "", ""
			}
			gid := "-"
			if a.RoCEv2GID != nil {
				gid = fmt.Sprint(*a.RoCEv2GID)
			} else if a.Address != "" {
				gid = "none"
			}
			route := "-"
			switch {
			case a.RouteNetdev != "":
				route = a.Peer + " dev " + a.RouteNetdev
			case a.RouteError != "":
				route = a.Peer + " error"
			}
			tt.printf("  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dev, port, nd, dash(a.Address), gid, arp, shares, route)
		}
	}
	tw.Flush()
}

func conf(v int) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprint(v)
}

// charSummary shows the character devices of the pod's RDMA devices that a
// process has, and how many others it sees besides.
func charSummary(have, want []string) string {
	if len(want) == 0 {
		return dash(strings.Join(have, " "))
	}
	var shown []string
	for _, h := range have {
		if slices.Contains(want, h) {
			shown = append(shown, h)
		}
	}
	s := dash(strings.Join(shown, " "))
	if others := len(have) - len(shown); others > 0 {
		s += fmt.Sprintf(" (+%d others)", others)
	}
	return s
}
