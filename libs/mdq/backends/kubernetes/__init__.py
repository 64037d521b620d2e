"""The Kubernetes execution backend: runner pods created with mdq's schedulerName, bound
through the Binding subresource, watched with resourceVersion, nodes and metrics.k8s.io read
for placement. ``backend.KubernetesBackend`` is the adapter; ``objects`` the pure mapping;
``settings`` its ``MDQ_K8S_*`` configuration."""
