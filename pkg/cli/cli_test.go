package cli

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		ok       bool
		inStderr string
	}{
		{nil, 0, true, ""},
		{[]string{"--n", "3"}, 0, true, ""},
		{[]string{"--help"}, 0, false, "Usage: x"},
		{[]string{"--bogus"}, 2, false, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, 2, false, `x cmd: unexpected argument "extra"`},
	} {
		var stderr bytes.Buffer
		fl := flag.NewFlagSet("x cmd", flag.ContinueOnError)
		fl.Int("n", 0, "a number")
		code, ok := Parse(fl, "Usage: x\n", tc.args, &stderr)
		if code != tc.code || ok != tc.ok || !strings.Contains(stderr.String(), tc.inStderr) {
			t.Errorf("Parse(%q) = %d, %v, stderr %q; want %d, %v, stderr with %q", tc.args, code, ok, stderr.String(), tc.code, tc.ok, tc.inStderr)
		}
		if tc.code == 2 && !strings.Contains(stderr.String(), "Usage: x") {
			t.Errorf("Parse(%q): usage error without the usage", tc.args)
		}
	}
}
