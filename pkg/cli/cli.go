// Package cli holds what the commands run by a person (doctor, install,
// the exporter) share about their command lines, so they answer --help,
// bad flags and stray arguments alike.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// Parse parses args with fl, which reports on stderr and answers --help,
// a bad flag or an argument left over with usage and then its flags. ok
// false means the command stops with code: 0 after --help, 2 on a usage
// error (a bad flag, which the flag package reports, or an argument left
// over, reported here with the usage).
func Parse(fl *flag.FlagSet, usage string, args []string, stderr io.Writer) (code int, ok bool) {
	SetUsage(fl, usage, stderr)
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fl.Name(), fl.Arg(0))
		fl.Usage()
		return 2, false
	}
	return 0, true
}

// SetUsage has fl report on stderr, and answer --help or a usage error with
// usage and then its flags.
func SetUsage(fl *flag.FlagSet, usage string, stderr io.Writer) {
	fl.SetOutput(stderr)
	fl.Usage = func() {
		fmt.Fprint(stderr, usage)
		fl.PrintDefaults()
	}
}
