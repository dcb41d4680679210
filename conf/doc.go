// Package conf holds the deployment manifests and example configurations of
// rdma-netns. It is a module of its own so that the Kubernetes API types its
// tests decode the manifests with never enter the plugin's dependencies.
package conf
