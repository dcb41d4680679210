//go:build e2e

package k8s

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The DaemonSet's exporter on the node: HTTPS with its self-signed
// certificate, /metrics behind TokenReview and SubjectAccessReview
// (conf/daemonset.yaml's defaults).
const (
	exporterURL = "https://127.0.0.1:9761/metrics"
	// metricsReader is the chart's ClusterRole granting get on /metrics
	// (release rdma-netns: conf/daemonset.yaml and helm_test.go's).
	metricsReader = "rdma-netns-metrics-reader"
	// scraperNS/scraperSA stand for Prometheus's ServiceAccount, bound
	// to metricsReader as exporter.auth.metricsReaders would bind it.
	scraperNS, scraperSA = "default", "e2e-metrics-scraper"
)

// saToken is a token of the ServiceAccount ns/name, as the kubelet
// projects into its pods (TokenRequest).
func saToken(t *testing.T, ns, name string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx(t), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of ServiceAccount %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// scraperToken is the token of a ServiceAccount bound to the chart's
// metrics reader, created on first use.
func scraperToken(t *testing.T) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: scraperSA, Namespace: scraperNS}}
	if _, err := cs.CoreV1().ServiceAccounts(scraperNS).Create(ctx(t), sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: scraperSA},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: metricsReader},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: scraperSA, Namespace: scraperNS}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx(t), crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return saToken(t, scraperNS, scraperSA)
}

// getMetrics GETs the exporter's /metrics with token ("" for none), not
// verifying its self-signed certificate, as a ServiceMonitor with
// insecureSkipVerify does.
func getMetrics(token string) (int, string, error) {
	return getMetricsAt(exporterURL, token)
}

// getMetricsAt is getMetrics of the exporter at url.
func getMetricsAt(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// scrape is the exporter's /metrics as Prometheus, bound to the metrics
// reader, gets it.
func scrape(t *testing.T) string {
	t.Helper()
	code, body, err := getMetrics(scraperToken(t))
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET %s as %s/%s: %d (%v)\n%s", exporterURL, scraperNS, scraperSA, code, err, body)
	}
	return body
}

// A pod without the right reads nothing of the exporter: no token is
// 401, a tenant's ServiceAccount token 403; Prometheus's gets the
// metrics.
func TestExporterRefusesTenants(t *testing.T) {
	for _, tc := range []struct {
		who   string
		token func() string
		want  int
	}{
		{"no token", func() string { return "" }, http.StatusUnauthorized},
		{"a made-up token", func() string { return "not-a-token" }, http.StatusUnauthorized},
		{"the default ServiceAccount of namespace default (a tenant)", func() string { return saToken(t, "default", "default") }, http.StatusForbidden},
		{"a ServiceAccount bound to " + metricsReader, func() string { return scraperToken(t) }, http.StatusOK},
	} {
		code, body, err := getMetrics(tc.token())
		if err != nil || code != tc.want {
			t.Errorf("%s: %d (%v), want %d\n%.300s", tc.who, code, err, tc.want, body)
		}
		if code != http.StatusOK && strings.Contains(body, "rdma_exporter_") {
			t.Errorf("%s: refused with %d, yet metrics in the answer:\n%.300s", tc.who, code, body)
		}
		t.Logf("%s: %d", tc.who, code)
	}
}
