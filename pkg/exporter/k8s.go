package exporter

import "github.com/rdma-netns/rdma-netns/pkg/state"

// podOf is replaced by the record's K8sNamespace/K8sPod once pkg/state has them.
func podOf(r *state.Record) (namespace, pod string) { return "", "" }
