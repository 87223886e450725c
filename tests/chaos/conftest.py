"""The fault-injection suite: `make test` runs it short, `make chaos` (COS_CHAOS=long) long.

Each scenario records what it published, what was stored and projected, what was lost,
duplicated or dead-lettered, and how long recovery took; the table is printed at the end of the
run and written to $COS_CHAOS_REPORT (default chaos-report.json in the temporary folder).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import reported

LONG = os.environ.get("COS_CHAOS") == "long"
REPORT: list[dict[str, Any]] = []
#: The user property each scenario's row travels in, from the test process that ran it.
REPORT_PROPERTY = "chaos_report"
COLUMNS = ("scenario", "published", "stored", "projected", "lost", "duplicated", "dead_lettered", "recovery_s")


def intensity(short: int, long: int) -> int:
    return long if LONG else short


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> Callable[..., None]:
    def record(**fields: Any) -> None:
        row = json.loads(json.dumps({"scenario": request.node.name.removeprefix("test_"), **fields}, default=str))
        # On the test's report too: a test process of `make test` (pytest-xdist) sends it to the one printing.
        request.node.user_properties.append((REPORT_PROPERTY, row))

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    REPORT[:] = reported(terminalreporter, REPORT_PROPERTY)
    if not REPORT:
        return
    tr = terminalreporter
    tr.section(f"chaos report ({'long' if LONG else 'short'})")
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in REPORT)) for c in COLUMNS]
    tr.write_line("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for row in REPORT:
        tr.write_line("  ".join(_fmt(row.get(c)).ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    path = Path(os.environ.get("COS_CHAOS_REPORT", Path(tempfile.gettempdir()) / "chaos-report.json"))
    path.write_text(json.dumps({"mode": "long" if LONG else "short", "scenarios": REPORT}, indent=2, default=str))
    tr.write_line(f"written to {path}")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
