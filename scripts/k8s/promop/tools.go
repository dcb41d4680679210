//go:build tools

// Package promop only pins what build.sh runs: controller-gen, over the
// operator's API types.
package promop

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
