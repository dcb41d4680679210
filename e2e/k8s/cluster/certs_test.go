package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The API server's certificate is valid for every name its clients dial:
// the host's loopback, the guest's forwarded address and the Service; the
// clients' certificates name the users and groups RBAC and the Node
// authorizer expect.
func TestPKI(t *testing.T) {
	dir := t.TempDir()
	if err := writePKI(dir, 2); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(loadCert(t, filepath.Join(dir, "ca.crt")))
	srv := loadCert(t, filepath.Join(dir, "apiserver.crt"))
	for _, name := range []string{"127.0.0.1", "10.0.2.100", "localhost", "kubernetes.default.svc", serviceIP} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	for name, want := range map[string][2]string{
		"kubelet":            {"system:node:localhost", "system:nodes"},
		"kubelet-2":          {"system:node:127.0.0.2", "system:nodes"},
		"admin":              {"kubernetes-admin", "system:masters"},
		"controller-manager": {"system:kube-controller-manager", ""},
		"scheduler":          {"system:kube-scheduler", ""},
	} {
		c := loadCert(t, filepath.Join(dir, name+".crt"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		org := ""
		if len(c.Subject.Organization) > 0 {
			org = c.Subject.Organization[0]
		}
		if c.Subject.CommonName != want[0] || org != want[1] {
			t.Errorf("%s: user %q group %q, want %q %q", name, c.Subject.CommonName, org, want[0], want[1])
		}
		if _, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")); err != nil {
			t.Errorf("%s: key does not match: %v", name, err)
		}
	}
	kc := filepath.Join(dir, "kubelet.conf")
	if err := writeKubeconfig(kc, "https://"+GuestAPIServer, dir, "kubelet"); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://10.0.2.100:6443" || len(rc.CertData) == 0 || len(rc.CAData) == 0 {
		t.Errorf("kubelet kubeconfig: host %q, %d bytes of cert, %d of CA", rc.Host, len(rc.CertData), len(rc.CAData))
	}
}
