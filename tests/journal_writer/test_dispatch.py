"""The journal-writer's dispatch over the event union is exhaustive, and its session screens derive from it.

`plan_event` ends in `assert_never`: mypy fails when an event type of the union has no case, shown here by
type-checking a copy of the module whose union holds one type more. `SESSION_EVENTS` (the ownership and
tombstone screens) is every type the projection stores but the profile-level ones, checked here against
what `plan_event` does with a golden payload of each type.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from commonos.journal_writer import projection
from commonos.journal_writer.projection import PROJECTED_ELSEWHERE, SESSION_EVENTS, Plan, plan_event
from commonos.proto import events as ev

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "v1"


def _sample(event_type: type[ev.EventBase]) -> ev.Event:
    golden = msgspec.json.decode((GOLDEN / f"{event_type.__struct_config__.tag}.json").read_bytes())
    return ev.decode_event(msgspec.json.encode(golden["body"]))


def _rows(event: ev.Event) -> int:
    plan = Plan()
    plan_event(plan, event)
    return sum(len(rows) for rows in plan.rows.values())


@pytest.mark.parametrize("event_type", ev.EVENT_TYPES, ids=lambda t: t.__name__)
def test_session_events_are_the_session_level_types_the_projection_stores(event_type: type[ev.EventBase]) -> None:
    event = _sample(event_type)
    stored = _rows(event) > 0
    assert stored == (event_type not in PROJECTED_ELSEWHERE)
    assert (event_type in SESSION_EVENTS) == (stored and event.session_id != ev.NO_SESSION)
    assert ev.is_profile_event(event_type) == (event_type in (ev.ProfileUpserted, ev.ProfileDeleted))


def test_an_event_type_without_a_case_fails_mypy(tmp_path: Path) -> None:
    source = Path(projection.__file__).read_text()
    signature = "def plan_event(plan: Plan, event: ev.Event) -> None:"
    assert signature in source
    unhandled = source.replace(signature, "def plan_event(plan: Plan, event: ev.Event | Unhandled) -> None:")
    unhandled += '\n\nclass Unhandled(ev.EventBase, frozen=True, kw_only=True, tag="unhandled"):\n    pass\n'
    module = tmp_path / "unhandled_projection.py"
    module.write_text(unhandled)
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental"]
    checked = subprocess.run([*mypy, str(module)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert checked.returncode == 1, checked.stdout  # the module as it is passes: `make lint`
    assert 'Argument 1 to "assert_never" has incompatible type "Unhandled"' in checked.stdout, checked.stdout
