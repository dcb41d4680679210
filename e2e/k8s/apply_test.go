//go:build e2e

package k8s

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// apply applies every object of a YAML stream as `kubectl apply
// --server-side` does: the API server merges it, validates it and
// refuses what it would refuse from kubectl.
func apply(ctx context.Context, manifest []byte) error {
	return applyKinds(ctx, manifest, nil)
}

// applyKinds applies the objects of the kinds listed (all if kinds is nil).
func applyKinds(ctx context.Context, manifest []byte, kinds map[string]bool) error {
	return applyValidated(ctx, manifest, kinds, "")
}

// applyStrict applies as `kubectl apply --server-side
// --validate=strict` does: a field the object's schema does not know is
// an error, where the default drops it with a warning.
func applyStrict(ctx context.Context, manifest []byte) error {
	return applyValidated(ctx, manifest, nil, metav1.FieldValidationStrict)
}

// applyValidated applies with the API server's field validation
// validation ("": its default).
func applyValidated(ctx context.Context, manifest []byte, kinds map[string]bool, validation string) error {
	objs, err := decodeObjects(manifest)
	if err != nil {
		return err
	}
	rc, err := newResourceClients()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if kinds != nil && !kinds[obj.GetKind()] {
			continue
		}
		ri, err := rc.of(obj)
		if err != nil {
			return err
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: "rdma-netns-e2e", Force: &force, FieldValidation: validation}); err != nil {
			return fmt.Errorf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	return nil
}

// deleteAbsent deletes the objects of manifest that keep (another
// manifest) does not hold, as `helm upgrade` deletes what the new values
// no longer render: DaemonSets first, so that their pods stop before
// their ServiceAccount and roles go. Objects already gone are fine.
func deleteAbsent(ctx context.Context, manifest, keep []byte) error {
	objs, err := decodeObjects(manifest)
	if err != nil {
		return err
	}
	kept, err := decodeObjects(keep)
	if err != nil {
		return err
	}
	rc, err := newResourceClients()
	if err != nil {
		return err
	}
	id := func(o *unstructured.Unstructured) string {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	keeps := map[string]bool{}
	for _, o := range kept {
		keeps[id(o)] = true
	}
	rank := func(o *unstructured.Unstructured) int {
		if o.GetKind() == "DaemonSet" {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return cmp.Compare(rank(a), rank(b)) })
	for _, obj := range objs {
		if keeps[id(obj)] {
			continue
		}
		ri, err := rc.of(obj)
		if err != nil {
			return err
		}
		if err := ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s: %v", id(obj), err)
		}
	}
	return nil
}

// decodeObjects are the objects of a YAML stream, in order.
func decodeObjects(manifest []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// resourceClients finds the API resource of an object of any kind.
type resourceClients struct {
	mapper *restmapper.DeferredDiscoveryRESTMapper
	dyn    *dynamic.DynamicClient
}

func newResourceClients() (*resourceClients, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	return &resourceClients{restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), dyn}, nil
}

// of is the client of obj's resource, in its namespace ("default" for a
// namespaced object that names none).
func (rc *resourceClients) of(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := rc.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v", gvk.Kind, obj.GetName(), err)
	}
	if m.Scope.Name() != "namespace" {
		return rc.dyn.Resource(m.Resource), nil
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = "default"
	}
	return rc.dyn.Resource(m.Resource).Namespace(ns), nil
}
