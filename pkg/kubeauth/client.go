// Package kubeauth admits an HTTP request when the Kubernetes API server
// says its bearer token may, as kube-rbac-proxy does in front of an
// exporter: the token is checked with a TokenReview and its user with a
// SubjectAccessReview for a non-resource URL. It talks to the API server
// with net/http and encoding/json alone, as the pod's ServiceAccount, so
// that the exporter links no Kubernetes client library.
package kubeauth

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// ServiceAccountDir is where the kubelet mounts a pod's ServiceAccount
// token and the cluster's CA.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client posts reviews to the API server.
type Client struct {
	// URL is the API server's, https://HOST:PORT.
	URL string
	// TokenFile holds the bearer token the client authenticates with. It
	// is read for each request: the kubelet rotates projected tokens.
	TokenFile string
	HTTP      *http.Client
}

// InCluster is the client of a pod: the kubernetes Service from the
// environment the kubelet sets, the pod's ServiceAccount token and the
// cluster's CA from dir (ServiceAccountDir).
func InCluster(dir string) (*Client, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not running in a pod of a cluster (outside one, serve without authentication: --auth=none)")
	}
	ca, err := os.ReadFile(dir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("the cluster's CA: %v (mount the pod's ServiceAccount token: automountServiceAccountToken or a projected volume at %s)", err, dir)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s/ca.crt holds no PEM certificate", dir)
	}
	if _, err := os.Stat(dir + "/token"); err != nil {
		return nil, fmt.Errorf("the pod's ServiceAccount token: %v", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	tr.Proxy = nil // the kubernetes Service is in the cluster
	return &Client{
		URL:       "https://" + net.JoinHostPort(host, port),
		TokenFile: dir + "/token",
		HTTP:      &http.Client{Transport: tr, Timeout: 10 * time.Second},
	}, nil
}

// maxResponse bounds what is read of an answer: a review is a few KiB.
const maxResponse = 1 << 20

// create POSTs obj to the API server's path and decodes the object it
// created (a review's answer) into out.
func (c *Client) create(ctx context.Context, path string, obj, out any) error {
	token, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return fmt.Errorf("reading the exporter's ServiceAccount token: %v", err)
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("POST %s: reading the answer: %v", path, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("POST %s: %s: the exporter's ServiceAccount may not create reviews (the chart's ClusterRole grants create on tokenreviews and subjectaccessreviews; is it bound?): %s", path, resp.Status, snippet(data))
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, snippet(data))
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("POST %s: decoding the answer: %v", path, err)
	}
	return nil
}

func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
