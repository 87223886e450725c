"""`make bench-scale` (bench/scale.py) at a tiny size, on its own real servers: two steps of 20,000 and 40,000
messages; scale.json has every figure at each size and every target, the chart is a PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.scale import CASES
from tests.conftest import REPO
from tests.harness import cleanup, make_temp_root

pytestmark = pytest.mark.slow


def test_two_tiny_steps_give_every_figure_and_the_chart() -> None:
    out = make_temp_root("cos-bench-scale-test-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COS_", "BENCH_SCALE_"))}
        argv = ["--sizes", "20k,40k", "--writer-events", "2000", "--runs", "3", "--out", str(out)]
        done = subprocess.run(
            [sys.executable, "-m", "bench.scale", *argv],
            cwd=REPO,
            env=env | {"COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
        result = json.loads((out / "scale.json").read_text())
        assert result["stopped"] is None
        assert result["method"]["drop_method"] in {
            "delete the month's rows, then VACUUM",
            "detach and drop the oldest month's partitions (cos retention)",
        }
        steps = result["steps"]
        assert [s["target_messages"] for s in steps] == [20_000, 40_000]
        for step in steps:
            counts = step["counts"]
            # The synthetic rows and the journal-writer's: at least the size, in the proportions.
            assert counts["messages"] >= step["target_messages"]
            assert counts["turns"] * 10 >= counts["messages"] * 0.9
            assert counts["tool_calls"] > 0 and counts["approvals"] > 0 and counts["model_calls"] > 0
            assert step["journal_writer"]["events"] >= 2000 and step["journal_writer"]["events_per_s"] > 0
            assert step["bytes"]["table_bytes_per_million_messages"] > 0
            assert step["bytes"]["index_bytes_per_million_messages"] > 0
            assert set(step["latency_ms"]) == set(CASES)
            for case in step["latency_ms"].values():
                assert case["runs"] == 3 and 0 < case["median"] <= case["p95"]
            assert step["latency_ms"]["search_rare"]["sessions_on_page"] >= 0
            assert step["latency_ms"]["seed_approvals"]["rows"] == counts["approvals"]
            drop = step["drop_oldest_month"]
            assert drop["seconds"] is not None, drop
            assert drop["messages"] > 0
        # The second step put the dropped month back before growing.
        assert steps[1]["generate"]["sessions"] > 500
        assert {
            "journal_writer_vs_first_step",
            "seed_approvals_growth",
            "drop_oldest_month_s",
            *(f"{c}_p95_ms" for c, (_, bound) in CASES.items() if bound is not None),
        } == set(result["targets"])
        # the chart: matplotlib is a test dependency, so it is always drawn here
        assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        cleanup(out)
