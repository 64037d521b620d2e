"""Campaigns as the end-to-end tests and the benchmarks write them: a job on a box of water and
the submit request of some jobs, as a campaign file says them (``MdqClient.submit_when_ready``
submits them to a stack that is still starting)."""

from __future__ import annotations

from google.protobuf import json_format

from mdq.contracts import pb


def water_job(
    name: str,
    *,
    steps: int,
    report_interval_steps: int,
    checkpoint_interval_steps: int,
    memory_mb: int = 1024,
    box_nm: float = 1.6,
    **fields: object,
) -> dict[str, object]:
    """A one-core OpenMM job on a box of water, as a campaign file writes it (``fields``: any
    more of its fields)."""
    return {
        "name": name,
        "system": {"water_box": {"box_nm": box_nm}},
        "steps": steps,
        "report_interval_steps": report_interval_steps,
        "checkpoint_interval_steps": checkpoint_interval_steps,
        "resources": {"cpu": 1, "memory_mb": memory_mb},
        **fields,
    }


def submit_request(*jobs: dict[str, object], key: str) -> pb.SubmitRequest:
    """The submit request of ``jobs`` (as a campaign file writes them) under the idempotency
    key ``key``."""
    return json_format.ParseDict({"idempotency_key": key, "jobs": list(jobs)}, pb.SubmitRequest())
