"""Execution backends: one port (``port.ClusterBackend``), a local and a Kubernetes adapter."""
