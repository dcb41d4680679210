package kubeauth

import (
	"context"
	"fmt"
)

// Verdict is what the API server said of a token.
type Verdict int

const (
	// Unauthenticated: the token is not one the API server accepts
	// (unknown, expired, revoked, or its audience is not the API server).
	Unauthenticated Verdict = iota
	// Forbidden: the token's user may not get the URL.
	Forbidden
	// Allowed: it may.
	Allowed
)

func (v Verdict) String() string {
	return [...]string{"unauthenticated", "forbidden", "allowed"}[v]
}

// User is who a token belongs to, as a TokenReview answers.
type User struct {
	Username string              `json:"username,omitempty"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// The parts of authentication.k8s.io/v1 TokenReview and
// authorization.k8s.io/v1 SubjectAccessReview used here.
type (
	typeMeta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	tokenReview struct {
		typeMeta
		Spec struct {
			Token string `json:"token"`
		} `json:"spec"`
		Status struct {
			Authenticated bool   `json:"authenticated"`
			User          User   `json:"user"`
			Error         string `json:"error,omitempty"`
		} `json:"status"`
	}
	nonResourceAttributes struct {
		Path string `json:"path"`
		Verb string `json:"verb"`
	}
	subjectAccessReview struct {
		typeMeta
		Spec struct {
			User                  string                 `json:"user,omitempty"`
			UID                   string                 `json:"uid,omitempty"`
			Groups                []string               `json:"groups,omitempty"`
			Extra                 map[string][]string    `json:"extra,omitempty"`
			NonResourceAttributes *nonResourceAttributes `json:"nonResourceAttributes"`
		} `json:"spec"`
		Status struct {
			Allowed         bool   `json:"allowed"`
			Denied          bool   `json:"denied,omitempty"`
			Reason          string `json:"reason,omitempty"`
			EvaluationError string `json:"evaluationError,omitempty"`
		} `json:"status"`
	}
)

// Review asks the API server who token is and whether that user may verb
// the non-resource path. An error means it could not tell (unreachable,
// or refusing the exporter's own requests): the caller must refuse.
func (c *Client) Review(ctx context.Context, token, path, verb string) (Verdict, User, error) {
	tr := tokenReview{typeMeta: typeMeta{"authentication.k8s.io/v1", "TokenReview"}}
	tr.Spec.Token = token
	if err := c.create(ctx, "/apis/authentication.k8s.io/v1/tokenreviews", &tr, &tr); err != nil {
		return Unauthenticated, User{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return Unauthenticated, User{}, nil
	}
	u := tr.Status.User
	sar := subjectAccessReview{typeMeta: typeMeta{"authorization.k8s.io/v1", "SubjectAccessReview"}}
	sar.Spec.User, sar.Spec.UID, sar.Spec.Groups, sar.Spec.Extra = u.Username, u.UID, u.Groups, u.Extra
	sar.Spec.NonResourceAttributes = &nonResourceAttributes{Path: path, Verb: verb}
	if err := c.create(ctx, "/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar, &sar); err != nil {
		return Unauthenticated, u, fmt.Errorf("SubjectAccessReview of %s: %w", u.Username, err)
	}
	if !sar.Status.Allowed || sar.Status.Denied {
		return Forbidden, u, nil
	}
	return Allowed, u, nil
}
