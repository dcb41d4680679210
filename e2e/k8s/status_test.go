//go:build e2e

package k8s

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// netStatus is one element of the k8s.v1.cni.cncf.io/network-status
// annotation Multus writes, with the fields the tests read.
type netStatus struct {
	Name       string   `json:"name"`
	Interface  string   `json:"interface"`
	IPs        []string `json:"ips"`
	Mac        string   `json:"mac"`
	Default    bool     `json:"default"`
	DeviceInfo *struct {
		Type    string `json:"type"`
		Version string `json:"version"`
		PCI     *struct {
			Address    string `json:"pci-address"`
			RDMADevice string `json:"rdma-device"`
		} `json:"pci"`
	} `json:"device-info"`
}

// networkStatus reads a pod's network-status annotation from the API
// server and returns it parsed, and as written.
func networkStatus(t *testing.T, ns, name string) ([]netStatus, string) {
	t.Helper()
	pod, err := cs.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw := pod.Annotations["k8s.v1.cni.cncf.io/network-status"]
	var status []netStatus
	if err := json.Unmarshal([]byte(raw), &status); err != nil {
		t.Fatalf("pod %s/%s: network-status annotation %q: %v", ns, name, raw, err)
	}
	return status, raw
}

// attachment is the element of status for a network on an interface (on
// any, iface ""), or nil.
func attachment(status []netStatus, network, iface string) *netStatus {
	for i, s := range status {
		if s.Name == network && (iface == "" || s.Interface == iface) {
			return &status[i]
		}
	}
	return nil
}
