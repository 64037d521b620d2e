"""``mdq simulate``: one JSON line comparing configurations, a plot, errors named."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from mdq.cli.main import app

SAMPLE = Path(__file__).parent.parent / "data" / "sample.swf"


def test_generated_workload_compares_every_configuration(tmp_path: Path) -> None:
    plot = tmp_path / "sim.png"
    result = CliRunner().invoke(
        app, ["simulate", "--nodes", "4", "--jobs", "120", "--plot", str(plot)]
    )
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout.splitlines()[0])
    assert line["workload"]["jobs"] == 120
    assert line["workload"]["nodes"] == 4
    names = [entry["config"] for entry in line["configs"]]
    assert names == ["fifo", "priority", "load-aware", "binpack", "fair-share", "learned"]
    for entry in line["configs"]:
        assert entry["succeeded"] + entry["failed"] + entry["cancelled"] == 120
    learned = line["configs"][-1]
    assert learned["memory_slack"] < line["configs"][0]["memory_slack"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_swf_trace_with_overrides() -> None:
    result = CliRunner().invoke(
        app,
        ["simulate", "--swf", str(SAMPLE), "-c", "fifo", "-c", "load-aware:target_load=0.7"],
    )
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout.splitlines()[0])
    assert line["workload"]["source"] == "swf"
    assert [entry["config"] for entry in line["configs"]] == [
        "fifo",
        "load-aware:target_load=0.7",
    ]


def test_errors_are_named(tmp_path: Path) -> None:
    unknown = CliRunner().invoke(app, ["simulate", "-c", "nope"])
    assert unknown.exit_code == 2
    assert "unknown 'nope'" in unknown.output
    bad = tmp_path / "bad.swf"
    bad.write_text("1 2 3\n")
    broken = CliRunner().invoke(app, ["simulate", "--swf", str(bad)])
    assert broken.exit_code == 2
    assert "line 1: 3 fields, SWF has 18" in broken.output
    both = CliRunner().invoke(app, ["simulate", "--swf", str(bad), "--from-history"])
    assert both.exit_code == 2
    assert "one source at a time" in both.output
