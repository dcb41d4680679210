// Package versions reads versions.env, the one file that names each
// component's version: the Makefile includes it and the scripts source
// it, so it holds only KEY=VALUE lines (no spaces, quotes or expansions)
// and # comments. The root module's tests and the conf module's read it
// through here.
package versions

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Read parses the versions file at path into its keys and values.
func Read(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok || val == "" || strings.ContainsAny(val, " \t\"'$") {
			return nil, fmt.Errorf("%s: %q is not KEY=VALUE (make includes the file and the scripts source it)", path, line)
		}
		v[key] = val
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return v, nil
}
