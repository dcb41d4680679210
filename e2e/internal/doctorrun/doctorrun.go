// Package doctorrun runs `rdma-netns doctor` for the in-VM suites and reads
// its --json report in the type the doctor writes it with. A package of its
// own, not part of rig: the doctor links rdmamap, which the suites that do
// not run it (e2e/multus) need not have in their modules.
package doctorrun

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// JSON runs `bin doctor ARGS --json` as a person at the node would (no
// CNI_ variable in its environment) and returns the report, in the type
// the doctor writes it with, and the exit status, which must agree with
// the report's.
func JSON(bin string, args ...string) (*doctor.Report, int, error) {
	out, errOut, code, err := runDoctor(bin, append(args, "--json")...)
	if err != nil {
		return nil, code, err
	}
	var r doctor.Report
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, code, fmt.Errorf("doctor --json: %v\n%s%s", err, out, errOut)
	}
	if code != r.ExitCode {
		return &r, code, fmt.Errorf("doctor --json exited %d, its report says %d", code, r.ExitCode)
	}
	return &r, code, nil
}

// Text runs `bin doctor ARGS` and returns what it prints for a
// person (its standard error after its output) and its exit status.
func Text(bin string, args ...string) (string, int, error) {
	out, errOut, code, err := runDoctor(bin, args...)
	return string(out) + string(errOut), code, err
}

func runDoctor(bin string, args ...string) (stdout, stderr []byte, code int, err error) {
	cmd := exec.Command(bin, append([]string{"doctor"}, args...)...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "CNI_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), errOut.Bytes(), ee.ExitCode(), nil
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("run %s doctor: %v", bin, err)
	}
	return out.Bytes(), errOut.Bytes(), 0, nil
}
