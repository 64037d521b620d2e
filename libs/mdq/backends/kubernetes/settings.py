"""Settings of the Kubernetes backend, env prefix ``MDQ_K8S_``.

Every service that uses the backend (placement creates and binds pods, the watcher follows
them, metrics samples the nodes) reads the same group, so one ConfigMap configures them all.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.settings import Seconds


class KubernetesSettings(BaseSettings):
    """Where the cluster is, and how mdq's runner pods look there."""

    model_config = SettingsConfigDict(env_prefix="MDQ_K8S_", extra="ignore")

    kubeconfig: str = Field(
        default="",
        description="Path of a kubeconfig file. Empty: in-cluster config when running in a pod "
        "(KUBERNETES_SERVICE_HOST is set), else ~/.kube/config.",
    )
    context: str = Field(default="", description="kubeconfig context; empty: the current one.")
    namespace: str = Field(default="mdq", description="Kubernetes namespace of the runner pods.")
    scheduler_name: str = Field(
        default="mdq-scheduler",
        description="schedulerName of every pod, so the default scheduler leaves them to mdq.",
    )
    runner_image: str = Field(default="mdq-runner:latest", description="Image of the runner.")
    image_pull_policy: str = Field(default="IfNotPresent", description="imagePullPolicy.")
    runner_command: tuple[str, ...] = Field(
        default=(),
        description="Container command (JSON list) of the runner image; empty: python -m "
        "services.runner. An operator setting: a pod description never names a command.",
    )
    runner_creds_secret: str = Field(
        default="",
        description="Fallback for a placement without a runner issuer (MDQ_NATS_RUNNER_ISSUER, "
        "which gives each runner pod a Secret of its own with credentials for its job alone): "
        "a Secret holding one identity for every runner (key nats.creds; the generator's "
        "runners.creds, which may report for any job), mounted read-only into every runner "
        "pod and named by its MDQ_NATS_CREDS; empty: runner pods get none (a server without "
        "authentication).",
    )
    checkpoint_pvc: str = Field(
        default="mdq-data",
        description="PersistentVolumeClaim with job outputs and checkpoints, mounted at the "
        "pod's MDQ_DATA_DIR; empty: no volume.",
    )
    data_mount_path: str = Field(
        default="", description="Where the claim is mounted; empty: the pod's MDQ_DATA_DIR."
    )
    priority_classes: dict[str, str] = Field(
        default_factory=lambda: {"high": "mdq-high", "normal": "mdq-normal", "low": "mdq-low"},
        description="mdq priority class -> Kubernetes PriorityClass name (JSON object); a class "
        "missing here or mapped to an empty name gets no priorityClassName.",
    )
    service_account: str = Field(
        default="", description="serviceAccountName of runner pods; empty: the namespace default."
    )
    cpu_limit: bool = Field(
        default=True, description="Set a CPU limit equal to the request (enforced cores)."
    )
    termination_grace_s: int = Field(
        default=30, ge=0, description="terminationGracePeriodSeconds: SIGTERM, then SIGKILL."
    )
    node_lost_after_s: float = Field(
        default=30.0,
        ge=0,
        description="A node whose Ready condition has not been True for this long (or that is "
        "gone) loses its pods: each is reported FAILED NodeLost and deleted.",
    )
    sandbox_timeout_s: Seconds = Field(
        default=120.0,
        description="A pod bound to a node whose sandbox (network, runtime) is still not made "
        "after this long ends StartError (the node's failure, never the job's) and is deleted; "
        "from half of it the node takes no new pods (mdq nodes shows why).",
    )
    node_selector: str = Field(
        default="", description="Label selector of the nodes mdq may use; empty: every node."
    )
    tolerated_taints: tuple[str, ...] = Field(
        default=(),
        description="Taint keys (JSON list) that do not make a node unavailable to mdq.",
    )
    watch_timeout_s: int = Field(
        default=240, ge=1, description="Server-side timeout of one watch request; then rewatch."
    )
    request_timeout_s: Seconds = Field(
        default=30.0, description="Timeout of every other API request."
    )
    retry_backoff_s: Seconds = Field(
        default=1.0, description="Pause before a watch is retried after an error."
    )
