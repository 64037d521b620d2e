"""The local execution backend: virtual nodes on this host, pods as runner subprocesses.

Its "API server" is two JetStream KV buckets (``records``), so every process shares it and it
survives restarts. ``LocalBackend`` (``api``) is the ``ClusterBackend`` the services use; the
node agent (``agent``, run as ``python -m mdq.backends.local``) is its kubelet: it runs the
pods bound to its nodes with their limits enforced and heartbeats the nodes' live load.
"""

from mdq.backends.local.api import LocalBackend

__all__ = ["LocalBackend"]
