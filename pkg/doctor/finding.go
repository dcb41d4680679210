package doctor

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

// Findings are what the checks of one run found, in the order they found
// it. Each check adds to them and knows no other check.
type Findings []Finding

func (fs *Findings) add(sev Severity, check, subject, reason, remedy string) {
	*fs = append(*fs, Finding{Severity: sev, Check: check, Subject: subject, Reason: reason, Remedy: remedy})
}

// summarize counts findings by severity, and gives the exit status: 1
// when any failed.
func summarize(fs []Finding) (summary map[Severity]int, exitCode int) {
	summary = map[Severity]int{OK: 0, Warn: 0, Fail: 0}
	for _, f := range fs {
		summary[f.Severity]++
		if f.Severity == Fail {
			exitCode = 1
		}
	}
	return summary, exitCode
}
