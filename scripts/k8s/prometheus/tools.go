//go:build tools

// Package prometheus only pins what build.sh builds: the Prometheus
// server.
package prometheus

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
