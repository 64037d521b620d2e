"""The mdq Python SDK: load job files, submit them, follow the jobs to their end.

::

    from mdq.sdk import MdqClient, load_job_file

    async with await MdqClient.connect("nats://127.0.0.1:4222") as client:
        job_ids = await client.submit(load_job_file("examples/demo.yaml"))
        async for job_id, progress in client.progress(job_ids):
            print(job_id, progress.step, progress.potential_kj_mol)
        print(await client.wait(job_ids, timeout=600))
"""

from mdq.errors import MdqError
from mdq.sdk.client import (
    IntakeUnavailable,
    JobNotInLog,
    JobUpdate,
    MdqClient,
    OperatorOnly,
    SubmitRefused,
    WaitTimeout,
    build_request,
)
from mdq.sdk.jobfile import JobFileError, load_job_file, parse_job_text, submit_from_document

__all__ = [
    "IntakeUnavailable",
    "JobFileError",
    "JobNotInLog",
    "JobUpdate",
    "MdqClient",
    "MdqError",
    "OperatorOnly",
    "SubmitRefused",
    "WaitTimeout",
    "build_request",
    "load_job_file",
    "parse_job_text",
    "submit_from_document",
]
