package doctor

import (
	"fmt"
	"strings"
)

// dash shows an empty value as "-" in reasons and tables.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// baseNames are the last elements of paths (uverbs0 of /dev/infiniband/uverbs0).
func baseNames(paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, p[strings.LastIndexByte(p, '/')+1:])
	}
	return out
}

// FormatBytes prints a size the way people say it: 64MiB, 1GiB, 8KiB.
func FormatBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	v := float64(n)
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == float64(uint64(v)) {
		return fmt.Sprintf("%d%s", uint64(v), units[i])
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}
