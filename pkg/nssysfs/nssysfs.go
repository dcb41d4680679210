// Package nssysfs shows sysfs as a given network namespace sees it.
//
// sysfs filters class/infiniband and class/net by the netns that was
// current when it was mounted, so the node's /sys shows only the host's
// RDMA devices and netdevs. The doctor and the exporter read a pod's
// devices (ports, GIDs, character devices) through In, which mounts a
// fresh sysfs from inside the pod's netns on a throw-away thread; the
// exporter, which reads the same namespaces on every scrape, keeps a
// detached sysfs per netns instead (Views).
package nssysfs

import "github.com/rdma-netns/rdma-netns/pkg/podns"

// In runs fn on a new OS thread that has joined the netns at nsPath, with
// root a read-only sysfs mounted there, in a private mount namespace of the
// thread; the thread is thrown away afterwards (podns.Sysfs). Needs
// CAP_SYS_ADMIN.
func In(nsPath string, fn func(root string) error) error {
	return podns.Do(nsPath, func(t podns.Thread) error { return fn(t.Sysfs) }, podns.Sysfs())
}
