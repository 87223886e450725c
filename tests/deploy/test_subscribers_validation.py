"""The Python validation SUBSCRIBERS.md shows (its ```python block that builds a `validator`) refuses an event
whose `occurred_at` is not a date-time, as ajv with ajv-formats does, and accepts the golden one."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest

from tests.deploy.conftest import DEPLOY, REPO

DOC = DEPLOY / "SUBSCRIBERS.md"
SCHEMA = REPO / "proto" / "schema" / "events" / "turn_finished" / "v1.json"
GOLDEN = REPO / "tests" / "golden" / "v1" / "turn_finished.json"


def documented_validation() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.M | re.S)
    [block] = [b for b in blocks if "validator = " in b]
    return str(block)


def validate(body: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    exec(documented_validation(), {"schema": schema, "body": body})


def golden_body() -> dict[str, Any]:
    found = json.loads(GOLDEN.read_text())
    return dict(found.get("body", found))


def test_the_documented_validation_accepts_the_golden_event() -> None:
    validate(golden_body())


def test_the_documented_validation_refuses_a_date_time_that_is_not_one() -> None:
    body = copy.deepcopy(golden_body())
    body["occurred_at"] = "yesterday at noon"
    with pytest.raises(jsonschema.ValidationError, match="date-time"):
        validate(body)
    # Plain jsonschema, without the format checker, lets it through: what the page warns about.
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(body)
