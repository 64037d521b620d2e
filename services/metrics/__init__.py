"""The metrics service: node load into the log, everything worth graphing out to Prometheus.

Every few seconds it samples the nodes through the cluster backend and publishes a
``node_load`` event per node (placement scores nodes with them). It folds the jobs log into
job counts by state and follows MD progress, and serves all of it, with the nodes' load, on
a Prometheus ``/metrics`` endpoint. ``app`` is the composition root, ``exporter`` the metric
definitions, ``folding`` the pure bookkeeping.
"""
