package exporter

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"time"
)

// selfSignedTLS serves with a certificate made now, for this node's host
// name, valid a year (the pod is restarted long before on any node that
// is upgraded); its key never leaves the process. A scraper cannot verify
// it (insecure_skip_verify), which still keeps the traffic, and the
// bearer tokens in it, from anyone only listening.
func selfSignedTLS() (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %v", err)
	}
	host, _ := os.Hostname()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "rdma-netns-exporter@" + host},
		NotBefore:    now.Add(-time.Hour), // a node's clock a little behind Prometheus's
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if host != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %v", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// reloadingTLS serves with the key pair in certFile and keyFile, loaded
// again when certFile changes, so that a certificate renewed in a mounted
// Secret (cert-manager) is served without a restart. A pair that fails to
// load keeps the last good one being served.
func reloadingTLS(certFile, keyFile string) (*tls.Config, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.get(nil); err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: r.get, MinVersion: tls.VersionTLS12}, nil
}

type certReloader struct {
	certFile, keyFile string
	mu                sync.Mutex
	cert              *tls.Certificate
	mtime             time.Time
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := os.Stat(r.certFile)
	if err == nil && r.cert != nil && st.ModTime().Equal(r.mtime) {
		return r.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		if r.cert != nil {
			return r.cert, nil
		}
		return nil, fmt.Errorf("--tls-cert-file %s, --tls-private-key-file %s: %v", r.certFile, r.keyFile, err)
	}
	r.cert = &pair
	if st != nil {
		r.mtime = st.ModTime()
	}
	return r.cert, nil
}
