"""Hypothesis profiles for the fuzz targets: `short` for `make test`, `long` for `make chaos`.

`COS_FUZZ_PROFILE=long` runs every pure target for 10,000 examples; the default `short` runs 300, in
a fixed (derandomized) order so `make test` is reproducible. No example database is kept, and what
Hypothesis caches (constants it collects, Unicode tables) goes to the temporary folder, so nothing is
written under the repository; a failure prints the blob to reproduce it. `make chaos` adds
`--hypothesis-show-statistics`, which prints how many examples each target ran; the integration
target's own figures (`fuzz_report`) are printed at the end of the run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, settings

from tests.harness import reported

# Read when Hypothesis first touches its storage, which is after this module is imported.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / "cos-fuzz-hypothesis"))

PROFILE_ENV: Final = "COS_FUZZ_PROFILE"
SHORT: Final = "cos-fuzz-short"
LONG: Final = "cos-fuzz-long"
#: Per example, for targets that only compute; file-reading targets allow twice as much.
PURE_DEADLINE: Final = timedelta(milliseconds=500)
#: A long run takes minutes per target; the suite-wide 300 s timeout is for one ordinary test.
LONG_TIMEOUT_S: Final = 3600

_common = settings(
    database=None,
    deadline=PURE_DEADLINE,
    print_blob=True,
    # Examples are large by design (megabyte strings, deep nesting): that is the point, not a smell.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
settings.register_profile(SHORT, _common, max_examples=300, derandomize=True)
settings.register_profile(LONG, _common, max_examples=10_000)

_chosen = os.environ.get(PROFILE_ENV, "short")
if _chosen not in ("short", "long"):
    raise pytest.UsageError(f"{PROFILE_ENV}={_chosen!r}: use short or long")
settings.load_profile(LONG if _chosen == "long" else SHORT)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if _chosen != "long":
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


#: Lines the integration target reports, printed at the end of the run.
FUZZ_REPORT: list[str] = []


#: The user property the report's lines travel in, from the test process that ran the target (pytest-xdist).
REPORT_PROPERTY: Final = "fuzz_report"


@pytest.fixture
def fuzz_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    return lambda line: request.node.user_properties.append((REPORT_PROPERTY, f"{request.node.name}: {line}"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    FUZZ_REPORT[:] = reported(terminalreporter, REPORT_PROPERTY)
    if FUZZ_REPORT:
        terminalreporter.section(f"fuzz report ({_chosen})")
        for line in FUZZ_REPORT:
            terminalreporter.write_line(line)
