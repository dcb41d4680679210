// Package multus runs rdma-netns the way its users do, invoked by Multus:
// Multus v4.3.0's own CmdAdd and CmdDel, linked as a library, drive the real
// plugin binaries in the test VM against a fake Kubernetes API holding the
// pod and its NetworkAttachmentDefinitions. The tests (build tag e2e) only
// work inside the test VM; `make e2e` runs them. This is a module of its
// own so that Multus and client-go stay out of the plugin's dependencies.
package multus
