"""Placement across execution clusters against a real JetStream: node
loads of two named clusters with their labels, jobs that require or prefer clusters, a chain
that follows its dependency's outputs, and the cluster choice in the log and in the waiting
explanation."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.placement import CLUSTER_MISMATCH
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    placement_of,
    running,
    submitted,
    wait_for,
    wait_for_events,
)

CAMPUS = {"site": "campus"}
CENTRE = {"site": "centre", "fabric": "infiniband"}


async def test_jobs_go_to_the_clusters_they_ask_for_and_chains_follow_their_data(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    # the centre is busier: a job that does not care goes to the campus
    await bus.publish_all(
        [
            node_load("dept/n1", cluster_labels=CAMPUS),
            node_load("dept/n2", cluster_labels=CAMPUS),
            node_load("hpc/n1", cpu_load=0.1, cluster_labels=CENTRE),
        ]
    )
    await bus.publish_all(
        [
            submitted("c1-any"),
            submitted("c1-ib", clusters=pb.ClusterSelector(require={"fabric": "infiniband"})),
            submitted("c1-gpu", clusters=pb.ClusterSelector(require={"gpu": "true"})),
        ]
    )
    async with running(placement_of(js, subjects, backend).run()):
        await wait_for_events(
            js, subjects, "bound", count=2, what="the two jobs a cluster admits bound"
        )
        bound = {e.job_id: e.bound for e in await events_of(js, subjects, "bound")}
        assert bound["c1-any"].cluster == "dept"
        assert bound["c1-ib"].node == "hpc/n1" and bound["c1-ib"].cluster == "hpc"
        # the pod goes to the cluster's node by its qualified name (the backend routes it)
        assert backend.pods["mdq-c1-ib-1"].node == "hpc/n1"
        clusters = {c.cluster: c for c in bound["c1-ib"].clusters}
        assert clusters["hpc"].best_node == "hpc/n1"
        assert clusters["dept"].best_node == ""
        assert clusters["dept"].filtered_counts == {CLUSTER_MISMATCH: 2}
        assert bound["c1-any"].clusters[0].cluster == "dept"  # best first

        # no cluster has a GPU: the job waits, and placement says so per cluster
        waiting = pb.JobWaiting()

        async def gpu_explained() -> bool:
            try:
                kv = await js.key_value(subjects.waiting_bucket)
                entry = await kv.get("c1-gpu")
            except (BucketNotFoundError, KeyNotFoundError):
                return False
            waiting.ParseFromString(entry.value or b"")
            return True

        await wait_for(gpu_explained, what="the GPU job's waiting explanation")
        assert {c.cluster: dict(c.filtered_counts) for c in waiting.clusters} == {
            "dept": {CLUSTER_MISMATCH: 2},
            "hpc": {CLUSTER_MISMATCH: 1},
        }

        # a chain: its analysis goes where its MD run left its outputs, on the busier cluster
        await bus.publish(submitted("c1-analyze", depends_on=("c1-ib",)))
        await bus.publish(event("started", pb.JobStarted(node="hpc/n1"), job="c1-ib", attempt=1))
        await bus.publish(event("succeeded", pb.JobSucceeded(final_step=1), job="c1-ib", attempt=1))

        await wait_for_events(
            js, subjects, "bound", "c1-analyze", count=1, what="the analysis bound"
        )
        [analysis] = await events_of(js, subjects, "bound", "c1-analyze")
        assert analysis.bound.cluster == "hpc"
