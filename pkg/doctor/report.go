package doctor

import (
	"io"
)

// Report is everything one run found. Node is set for the node view, Pod
// for the pod view, NADs for `doctor nads`.
type Report struct {
	Node     *NodeView `json:"node,omitempty"`
	Pod      *PodView  `json:"pod,omitempty"`
	NADs     *NADsView `json:"nads,omitempty"`
	Findings Findings  `json:"findings"`
	// Summary counts the findings by severity.
	Summary map[Severity]int `json:"summary"`
	// ExitCode is what the command exits with: 1 when anything failed.
	ExitCode int `json:"exitCode"`
}

// CheckNode runs the node checks.
func CheckNode(e *Env) *Report {
	r := &Report{}
	r.Node = nodeChecks(e, &r.Findings)
	r.finish()
	return r
}

// CheckPod runs the pod checks for the netns at nsPath; pid, when non-zero,
// limits the process checks to that process; gpus are PCI addresses of
// GPUs the pod holds that its processes' /dev does not show (a DRA
// claim's), judged with those it does.
func CheckPod(e *Env, nsPath string, pid int, gpus ...string) *Report {
	r := &Report{}
	r.Pod = podChecks(e, &r.Findings, nsPath, pid, gpus)
	r.finish()
	return r
}

// CheckNADs checks the NetworkAttachmentDefinitions read from in (kubectl's
// JSON): per NAD, who picks the NIC and whether rdma-netns sees the pick;
// across NADs, the RDMA device names their pods may take from each other.
func CheckNADs(in io.Reader) *Report {
	r := &Report{}
	r.NADs = nadChecks(in, &r.Findings)
	r.finish()
	return r
}

// finish fills Summary and ExitCode from the findings.
func (r *Report) finish() {
	r.Summary, r.ExitCode = summarize(r.Findings)
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	return writeJSON(w, r)
}

// WriteText writes the report for a person: the view as aligned tables,
// then the findings, worst first within their original order.
func (r *Report) WriteText(w io.Writer) error {
	var s []section
	if r.Node != nil {
		s = append(s, r.Node.sections()...)
	}
	if r.Pod != nil {
		s = append(s, r.Pod.sections()...)
	}
	if r.NADs != nil {
		s = append(s, r.NADs.sections()...)
	}
	return writeText(w, s, r.Findings, r.Summary, r.ExitCode)
}
