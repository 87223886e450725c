"""The exported schema and the golden messages, as other teams read them with stock tools.

Every golden message (tests/golden/v<N>/: headers and body, of every event and alert type) is validated by
the schema its `ce-dataschema` header names, and every event by the union too:

* in Python, by `jsonschema` (draft 2020-12, formats checked);
* in Node, by ajv in strict mode with ajv-formats (each schema file compiled on its own), and the CloudEvents
  JavaScript SDK builds a CloudEvent from the headers and body in binary mode and validates it.

Payloads that a consumer must refuse (a string where a decimal belongs, no `event_id`, a finished turn still
`running`, ...) are refused by both validators. The npm packages are pinned and installed once into
`.cos/node/schema-validators/` (npm's cache beside it); npm failing is a test failure saying so, never a skip.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from commonos.proto.cloudevents import percent_decode

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "proto" / "schema"
GOLDEN = REPO / "tests" / "golden"
SCRIPT = Path(__file__).with_name("schema_validators.cjs")
PACKAGES = REPO / ".cos" / "node" / "schema-validators"
NPM_CACHE = REPO / ".cos" / "node" / "npm-cache"
#: The stock tools, pinned.
NPM_PACKAGES: Final = {"ajv": "8.20.0", "ajv-formats": "3.0.1", "cloudevents": "10.0.0"}
UNION_ID: Final = "https://commonos.dev/schemas/events.schema.json"


# --- the goldens and the mutations a consumer must refuse --------------------------------------------------


def goldens() -> dict[str, dict[str, Any]]:
    """Every golden message of every version, by its path under tests/golden/."""
    return {
        path.relative_to(GOLDEN).as_posix(): json.loads(path.read_text())
        for version in sorted(GOLDEN.glob("v*"))
        for path in sorted(version.rglob("*.json"))
    }


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body[key] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        del body[key]

    return change


def _drop_graph_list(body: dict[str, Any]) -> None:
    del body["graph"]["sessions"]


def _bad_role(body: dict[str, Any]) -> None:
    body["content"]["role"] = "system"


#: (name, golden, change to its body): each result must be refused by every validator.
MUTATIONS: Final[list[tuple[str, str, Callable[[dict[str, Any]], None]]]] = [
    ("decimal given as a word", "v1/model_call_completed.json", _set("reported_cost_usd", "abc")),
    ("decimal given as a number", "v1/model_call_completed.json", _set("reported_cost_usd", 0.0123)),
    ("no event_id", "v1/model_call_completed.json", _drop("event_id")),
    ("no event_id", "v1/turn_started.json", _drop("event_id")),
    ("no occurred_at", "v1/session_created.json", _drop("occurred_at")),
    ("event_id not a uuid", "v1/session_created.json", _set("event_id", "not-a-uuid")),
    ("occurred_at without its offset", "v1/session_created.json", _set("occurred_at", "2026-11-30T09:00:00")),
    ("a finished turn still running", "v1/turn_finished.json", _set("status", "running")),
    ("no message_id", "v1/message_appended.json", _drop("message_id")),
    ("a role that does not exist", "v1/message_appended.json", _bad_role),
    ("no tool_call_id", "v1/tool_call_recorded.json", _drop("tool_call_id")),
    ("no session_id on a profile event", "v1/profile_upserted.json", _drop("session_id")),
    ("a graph without its sessions", "v1/transcript_imported.json", _drop_graph_list),
    ("a context snapshot that is a string", "v1/turn_started.json", _set("context_snapshot", "Be brief.")),
    ("a tag that is no tag", "v1/session_created.json", _set("tags", ["Area:x"])),
    ("an unknown type", "v1/session_created.json", _set("type", "session_renamed")),
    ("alert: decimal given as a word", "v1/alerts/budget_exceeded.json", _set("spent_usd", "abc")),
    ("alert: no event_id", "v1/alerts/budget_exceeded.json", _drop("event_id")),
    ("alert: period unknown", "v1/alerts/budget_exceeded.json", _set("period", "week")),
]


def mutated_cases() -> list[dict[str, Any]]:
    all_goldens = goldens()
    cases = []
    for what, golden, change in MUTATIONS:
        body = copy.deepcopy(all_goldens[golden]["body"])
        change(body)
        cases.append({"name": f"{golden}: {what}", "headers": all_goldens[golden]["headers"], "body": body})
    return cases


def test_every_golden_is_mutated_in_a_way_both_validators_must_refuse() -> None:
    assert {golden for _, golden, _ in MUTATIONS} <= set(goldens())
    assert len(goldens()) >= 15  # every event type (message_appended thrice) and the budget alert


# --- Python: jsonschema ---------------------------------------------------------------------------------------

_RFC3339: Final = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _format_checker() -> FormatChecker:
    """jsonschema's formats, with `date-time` checked as RFC 3339 says even without its optional package."""
    checker = FormatChecker()

    @checker.checks("date-time", raises=ValueError)
    def _date_time(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        if _RFC3339.match(instance) is None:
            return False
        datetime.fromisoformat(instance.replace("z", "Z").replace("Z", "+00:00").replace("t", "T"))
        return True

    assert "uuid" in checker.checkers
    return checker


@cache
def python_validators() -> dict[str, Draft202012Validator]:
    """A validator per schema file, by `$id`; each file must be a valid draft 2020-12 schema on its own."""
    validators = {}
    checker = _format_checker()
    for path in sorted(SCHEMA_DIR.rglob("*.json")):
        schema = json.loads(path.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", path
        Draft202012Validator.check_schema(schema)
        validators[schema["$id"]] = Draft202012Validator(schema, format_checker=checker)
    return validators


def _schema_of(headers: dict[str, str]) -> str:
    return percent_decode(headers["ce-dataschema"])


def python_errors(case: dict[str, Any]) -> dict[str, list[str]]:
    """What jsonschema says of a case's body: per schema (its type's, and the union for events), the errors."""
    validators = python_validators()
    schema_id = _schema_of(case["headers"])
    ids = [schema_id, UNION_ID] if "/events/" in schema_id else [schema_id]
    return {
        each: [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validators[each].iter_errors(case["body"])
        ]
        for each in ids
    }


@pytest.mark.parametrize("path", sorted(goldens()))
def test_jsonschema_accepts_every_golden(path: str) -> None:
    case = goldens()[path]
    assert _schema_of(case["headers"]) in python_validators(), f"{path}: ce-dataschema names no exported schema"
    errors = python_errors(case)
    assert errors and all(not e for e in errors.values()), errors


@pytest.mark.parametrize("case", mutated_cases(), ids=lambda case: case["name"])
def test_jsonschema_refuses_what_a_consumer_must_refuse(case: dict[str, Any]) -> None:
    errors = python_errors(case)
    assert errors and all(errors.values()), f"accepted by {[k for k, v in errors.items() if not v]}"


# --- Node: ajv (strict) with ajv-formats, and the CloudEvents SDK ----------------------------------------------


def _npm_failed(what: str, detail: str) -> AssertionError:
    return AssertionError(
        f"could not install the stock JavaScript validators ({what}): {detail}\n"
        f"these tests need node 18+ and npm with the npm registry reachable; packages go to {PACKAGES}"
    )


def _installed() -> bool:
    for name, version in NPM_PACKAGES.items():
        manifest = PACKAGES / "node_modules" / name / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


@cache
def node_packages() -> Path:
    """ajv, ajv-formats and the CloudEvents SDK at their pinned versions, installed outside the source tree; test
    processes running at once (`make test` runs two) take turns, holding a lock on a file beside the folder (two
    `npm install` in one folder break each other: ENOTEMPTY)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise _npm_failed("node or npm", "not installed")
    PACKAGES.mkdir(parents=True, exist_ok=True)
    with (PACKAGES.parent / "schema-validators.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _install_node_packages()


def _install_node_packages() -> Path:
    if _installed():
        return PACKAGES
    (PACKAGES / "package.json").write_text(
        json.dumps({"name": "cos-schema-validators", "private": True, "dependencies": NPM_PACKAGES}, indent=2) + "\n"
    )
    env = {"npm_config_cache": str(NPM_CACHE), "npm_config_update_notifier": "false"}
    try:
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--save-exact", "--prefer-offline"],
            cwd=PACKAGES,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise _npm_failed("npm install", "took over 300 s") from None
    if done.returncode != 0 or not _installed():
        said = " ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise _npm_failed("npm install", f"exit {done.returncode}: {said}")
    return PACKAGES


def run_node(cases: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    packages = node_packages()
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(cases))
    done = subprocess.run(
        ["node", str(SCRIPT), str(packages), str(SCHEMA_DIR), str(cases_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"schema_validators.cjs failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_ajv_strict_and_the_cloudevents_sdk_accept_every_golden(tmp_path: Path) -> None:
    cases = [{"name": path, **golden} for path, golden in sorted(goldens().items())]
    out = run_node(cases, tmp_path)
    assert out["versions"] | {"node": None} == {**NPM_PACKAGES, "node": None}
    exported = sorted(path.relative_to(SCHEMA_DIR).as_posix() for path in SCHEMA_DIR.rglob("*.json"))
    assert sorted(out["compiled"]) == exported  # every file compiled in strict mode
    assert len(out["results"]) == len(cases)
    for result, case in zip(out["results"], cases, strict=True):
        assert result["name"] == case["name"]
        assert result["type"] == {"ok": True, "errors": []}, result
        if "/events/" in result["schema"]:
            assert result["union"] == {"ok": True, "errors": []}, result
        else:
            assert "union" not in result
        assert result["cloudevent"]["ok"], result
        headers = {k: percent_decode(v) for k, v in case["headers"].items()}
        assert result["cloudevent"]["subject"] == headers["ce-subject"]
        assert result["cloudevent"]["source"] == headers["ce-source"]


def test_ajv_strict_refuses_what_a_consumer_must_refuse(tmp_path: Path) -> None:
    cases = mutated_cases()
    out = run_node(cases, tmp_path)
    for result in out["results"]:
        assert not result["type"]["ok"] and result["type"]["errors"], result
        if "union" in result:
            assert not result["union"]["ok"], result


def test_the_cloudevents_sdk_refuses_headers_that_are_no_cloudevent(tmp_path: Path) -> None:
    golden = goldens()["v1/session_created.json"]
    no_source = {k: v for k, v in golden["headers"].items() if k != "ce-source"}
    bad_schema = {**golden["headers"], "ce-dataschema": "not%20a%20uri"}
    other_id = {**golden["headers"], "ce-id": "0193a000-0000-7000-8000-000000000999"}
    cases = [
        {"name": "no ce-source", "headers": no_source, "body": golden["body"]},
        {"name": "ce-dataschema no URI", "headers": bad_schema, "body": golden["body"]},
        {"name": "ce-id of another event", "headers": other_id, "body": golden["body"]},
    ]
    out = run_node(cases, tmp_path)
    for result in out["results"]:
        assert not result["cloudevent"]["ok"] and result["cloudevent"]["errors"], result
