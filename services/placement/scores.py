"""Placement's scores as the contract's messages: the candidates of a ``bound`` event and of a
waiting job's explanation (docs/placement.md, "Explain")."""

from __future__ import annotations

from collections.abc import Iterable

from mdq.contracts import pb
from mdq.core.placement import ClusterSummary, NodeScore

ExplainedScores = dict[int, tuple[NodeScore, bytes]]
"""id(score) -> (the score, its encoded ``JobBound.candidates`` entry), for one plan."""


def candidate_entry(score: NodeScore) -> bytes:
    """One ``JobBound.candidates`` entry in wire format (tag, length, message): entries
    concatenate into the repeated field."""
    return pb.JobBound(candidates=[node_score_message(score)]).SerializeToString(deterministic=True)


def node_score_message(score: NodeScore) -> pb.NodeScore:
    """A core ``NodeScore`` as the contract's message."""
    return pb.NodeScore(
        node=score.node,
        score=score.score,
        filtered=score.filtered,
        cpu_load=score.cpu_load,
        memory_load=score.memory_load,
    )


def cluster_score_messages(summaries: Iterable[ClusterSummary]) -> list[pb.ClusterScore]:
    """Core ``ClusterSummary``s as the contract's messages."""
    return [
        pb.ClusterScore(
            cluster=summary.cluster,
            best_score=summary.best_score,
            best_node=summary.best_node,
            candidates=summary.candidates,
            filtered_counts=summary.filtered_counts,
            cpu_reserved=summary.cpu_reserved,
        )
        for summary in summaries
    ]
