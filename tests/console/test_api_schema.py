"""The console's JSON API against its own OpenAPI document (/api/openapi.json), with schemathesis: every operation
the document lists gets requests generated from it (valid ones and, where the document allows, invalid ones) and
none may be answered with a server error (schemathesis's `not_a_server_error` check).

On real data (the sample sessions, a hostile pair and a delegated child, projected by the journal-writer and
billing), signed in as the operator and as an analyst (whose reads run under row-level security), with the
CSRF token: schemathesis's coverage phase (boundary values, each way a parameter can be wrong) and its fuzzing
(valid and invalid data), path parameters drawn both at random and from the sessions that exist. Deterministic
(Hypothesis derandomized, no example database) and bounded (a few examples per operation and mode).

schemathesis's requests are synchronous, and the console runs in this test's event loop: they run in a thread.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st
from schemathesis import APIOperation, BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error

from tests.console.conftest import RunningConsole, Seeded
from tests.factories import SessionBuilder

#: Examples per operation, generation mode and path-parameter source: about 200 requests for each person.
MAX_EXAMPLES = 8
#: Coverage cases per operation (the operator's run only): boundary values and invalid parameters, about 400.
COVERAGE_CASES = 60
#: A stream answers with its headers and then follows: a read timeout is how such a call ends.
REQUEST_TIMEOUT_S = 10.0
#: Operations whose answer does not depend on who is signed in, run once with fewer cases (signing in checks an
#: argon2 hash: slow).
ANYONE = {("POST", "/api/login")}
LOGOUT = ("POST", "/api/logout")
FEWER = 4
#: Path parameters given the ids of what exists as well as random ones.
EXISTING = "session_id"

Operation = APIOperation[Any, Any, Any, Any]

SETTINGS = hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)


@dataclass
class Finding:
    operation: str
    who: str
    error: str


@dataclass
class Run:
    console: RunningConsole
    who: str
    headers: dict[str, str]
    #: The first run also covers the operations in ANYONE, and runs the coverage phase.
    first: bool
    findings: list[Finding] = field(default_factory=list)
    calls: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    statuses: Counter[int] = field(default_factory=Counter)


def is_stream(operation: Operation) -> bool:
    responses = operation.definition.raw.get("responses", {})
    return any("text/event-stream" in (r.get("content") or {}) for r in responses.values())


def documented_errors(operation: Operation) -> set[str]:
    """The 5xx answers the document gives the operation (a 500 is never one: it is an unhandled error)."""
    return {code for code in operation.definition.raw.get("responses", {}) if code.startswith("5") and code != "500"}


def check(run: Run, operation: Operation, session: requests.Session) -> Callable[[Case[Any]], None]:
    """The body of one generated test: call the console, check the answer, remember what failed."""

    def test(case: Case[Any]) -> None:
        run.calls += 1
        kwargs: dict[str, Any] = {"timeout": REQUEST_TIMEOUT_S}
        if is_stream(operation):
            kwargs["stream"] = True
        try:
            response = case.call(base_url=run.console.url, session=session, headers=run.headers, **kwargs)
        except requests.exceptions.ReadTimeout:
            if is_stream(operation):
                return  # a live stream that followed for as long as the client waited
            raise
        run.statuses[response.status_code] += 1
        if response.status_code != 500 and str(response.status_code) in documented_errors(operation):
            return  # e.g. chat's 503 "no loop service answers": the document says it may be
        case.validate_response(response, checks=[not_a_server_error])

    return test


def fuzz(run: Run, operation: Operation, strategy: st.SearchStrategy[Case[Any]], label: str) -> None:
    session = requests.Session()
    body = check(run, operation, session)
    examples = FEWER if (operation.method.upper(), operation.path) in ANYONE else MAX_EXAMPLES

    @hypothesis.settings(SETTINGS, max_examples=examples)
    @given(case=strategy)
    def generated(case: Case[Any]) -> None:
        body(case)

    started = time.perf_counter()
    try:
        generated()
    except hypothesis.errors.Unsatisfiable:
        if label != "negative data":
            raise
        # Nothing in the operation can be made invalid (no parameter, no body).
    except (Exception, BaseExceptionGroup) as exc:
        run.findings.append(
            Finding(
                f"{operation.method.upper()} {operation.path}",
                f"{run.who}, {label}",
                "".join(traceback.format_exception_only(type(exc), exc)).strip(),
            )
        )
    finally:
        session.close()
        run.timings[f"{operation.method.upper()} {operation.path} ({label})"] = time.perf_counter() - started


def cover(run: Run, schema: BaseSchema, operation: Operation) -> None:
    """schemathesis's coverage phase: the document's boundary values and each way a parameter can be wrong, in a
    fixed order (the first COVERAGE_CASES of them); the first failure is kept."""
    generation = schema.config.generation_for(operation=operation, phase="coverage")
    cases = schema.iter_coverage_cases(operation, generation_modes=list(GenerationMode), generation_config=generation)
    session = requests.Session()
    body = check(run, operation, session)
    started = time.perf_counter()
    try:
        limit = FEWER * 4 if (operation.method.upper(), operation.path) in ANYONE else COVERAGE_CASES
        for case in itertools.islice(cases, limit):
            try:
                body(case)
            except (Exception, BaseExceptionGroup) as exc:
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                run.findings.append(
                    Finding(f"{operation.method.upper()} {operation.path}", f"{run.who}, coverage", error)
                )
                return
    finally:
        session.close()
        run.timings[f"{operation.method.upper()} {operation.path} (coverage)"] = time.perf_counter() - started


def existing(operation: Operation, ids: list[str]) -> st.SearchStrategy[Case[Any]]:
    """Valid requests whose path names one of `ids`."""

    def with_id(value: str) -> st.SearchStrategy[Case[Any]]:
        return operation.as_strategy(path_parameters={EXISTING: value})

    return st.sampled_from(ids).flatmap(with_id)


def exercise(run: Run, session_ids: list[str]) -> None:
    schema = schemathesis.openapi.from_url(run.console.url + "/api/openapi.json", timeout=REQUEST_TIMEOUT_S)
    # The run signs in with its own cookie: no made-up API key or cookie from the document's securitySchemes.
    schema.config.generation.update(with_security_parameters=False)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, "the OpenAPI document lists no operation"
    # Signing out ends the run's sign-in (every later request is 401): it goes last.
    operations.sort(key=lambda o: (o.method.upper(), o.path) == LOGOUT)
    signed_out_before = run.statuses[204]
    for operation in operations:
        key = (operation.method.upper(), operation.path)
        if key in ANYONE and not run.first:
            continue
        if run.first:
            cover(run, schema, operation)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(run, operation, operation.as_strategy(generation_mode=mode), f"{mode.value} data")
        # Path parameters naming what exists (a session id), valid data otherwise.
        if EXISTING in {p.name for p in operation.path_parameters} and not is_stream(operation):
            fuzz(run, operation, existing(operation, session_ids), f"existing {EXISTING}")
        if key == LOGOUT:
            continue
        # Still signed in after every other operation: the answers were the signed-in person's, not "not signed in".
        me = requests.get(run.console.url + "/api/me", headers=run.headers, timeout=REQUEST_TIMEOUT_S)
        assert me.status_code == 200, (key, me.status_code)
    # A sign-out that was answered 204 held: the same cookie is refused now.
    if run.statuses[204] > signed_out_before:
        me = requests.get(run.console.url + "/api/me", headers=run.headers, timeout=REQUEST_TIMEOUT_S)
        assert me.status_code == 401, me.status_code


async def headers_of(console: RunningConsole, name: str) -> dict[str, str]:
    client, token = await console.signed_in(name)
    cookie = "; ".join(f"{c.key}={c.value}" for c in client.cookie_jar)
    return {"Cookie": cookie, "X-CSRF-Token": token}


@pytest.mark.timeout(240)
async def test_no_server_error_anywhere_in_the_api(
    console: RunningConsole, console_db: Seeded, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    session_ids = [str(s) for profile in ("acme", "globex") for s in console_db.sessions(profile)]
    assert len(session_ids) == 5
    runs = [Run(console, who, await headers_of(console, who), who == "olivia") for who in ("olivia", "alice")]
    for run in runs:
        await asyncio.to_thread(exercise, run, session_ids)
    findings = [f for run in runs for f in run.findings]
    assert all(run.calls > 50 for run in runs), [run.calls for run in runs]
    for run in runs:
        answered = sum(n for status, n in run.statuses.items() if 200 <= status < 300)
        # Many requests are meant to be refused (422, 405 to other methods, 404): still, some are answered, and
        # "not signed in" is only sign-in's wrong passwords.
        assert answered >= 20 and run.statuses[401] < run.calls // 10, (run.who, run.statuses)
    assert not findings, "\n\n".join(f"{f.operation} ({f.who}):\n{f.error}" for f in findings)
