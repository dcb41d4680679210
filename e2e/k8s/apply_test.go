//go:build e2e

package k8s

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

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
	dc, err := discovery.NewDiscoveryClientForConfig(restCfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		if kinds != nil && !kinds[gvk.Kind] {
			continue
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: "rdma-netns-e2e", Force: &force, FieldValidation: validation}); err != nil {
			return fmt.Errorf("%s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}
