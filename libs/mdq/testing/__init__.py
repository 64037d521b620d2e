"""Test doubles that are real servers: a Kubernetes API emulator and simulated kubelets.

``mdq.testing.kube_api.KubeApiEmulator`` serves the part of the Kubernetes API mdq uses over
HTTP; ``mdq.testing.kubelet.SimulatedKubelet`` runs the pods bound to its node as processes;
``mdq.testing.cluster.SimulatedCluster`` puts them together with a kubeconfig. ``python -m
mdq.testing`` runs such a cluster until Ctrl-C (for ``mdq up --backend kubernetes``).
"""
