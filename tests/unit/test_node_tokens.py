"""A node's name is one subject token, whatever Kubernetes called the node: a DNS subdomain's
dots would otherwise split ``NS.node.<node>.load`` into more tokens than ``NS.node.*.load``
(what the stream captures, the server lets metrics publish and placement follows) matches."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mdq.bus.subjects import Subjects, node_name, node_token
from mdq.contracts import pb
from mdq.core.events import make_event

SUBJECTS = Subjects("mdq")


@pytest.mark.parametrize(
    ("name", "node", "token"),
    [
        ("a local node is itself", "local-1", "local-1"),
        ("a cluster and its node keep their slash", "lab1/local-1", "lab1/local-1"),
        (
            "an EKS node's dots are escaped",
            "ip-10-0-0-1.ec2.internal",
            "ip-10-0-0-1%2Eec2%2Einternal",
        ),
        (
            "qualified and dotted",
            "burst/ip-10-0-0-1.ec2.internal",
            "burst/ip-10-0-0-1%2Eec2%2Einternal",
        ),
        ("a percent sign is escaped, so decoding is exact", "odd%2Ename", "odd%252Ename"),
        ("wildcards stay wildcards", "*", "*"),
        ("the full wildcard too", ">", ">"),
        ("spaces cannot split a subject either", "a b", "a%20b"),
    ],
)
def test_node_token(name: str, node: str, token: str) -> None:
    assert node_token(node) == token, name
    assert "." not in token, name
    assert node_name(token) == node, name


@pytest.mark.parametrize("node", ["ip-10-0-0-1.ec2.internal", "dept/n1.rack2.example.org"])
def test_a_dotted_node_load_is_published_on_four_tokens_the_stream_captures(node: str) -> None:
    event = make_event(
        "node_load",
        pb.NodeLoad(node=node),
        job_id="",
        attempt=0,
        producer="metrics",
        at=datetime(2026, 12, 3, tzinfo=UTC),
        detail=node,
    )
    subject = SUBJECTS.for_event(event)
    assert len(subject.split(".")) == len(SUBJECTS.node_load().split(".")) == 4
    assert node_name(subject.split(".")[2]) == node
