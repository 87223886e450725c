"""Projections registered once: what the journal-writer runs, what `cos up` and `cos replay` apply, what
deploy/postgres/roles.sql grants.

Each projection's package names one `Registration` under the `commonos.projections` entry point group
(pyproject.toml): `<order>-<name> = "<module>:<attribute>"`, the order being that of the specification (the
core's schema first). A test may add one for its duration (`registered`). Everything else reads
`registrations()`: the journal-writer's projections (`projections("journal-writer")`), the schemas
(`schemas()`), the tables a replay empties and the grants (`tables()`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Final

from commonos.runtime.projection import Projection
from commonos.runtime.tables import Table

__all__ = ["GROUP", "Registration", "projections", "registered", "registrations", "schemas", "tables"]

GROUP: Final = "commonos.projections"


@dataclass(frozen=True, eq=False)
class Registration:
    """A projection as registered: its tables, its schema's SQL and how its service makes instances."""

    #: Short name (`core`, `graph`, `memory`, `billing`).
    name: str
    #: The service that runs it (`journal-writer`, `billing`): `cos replay` rebuilds the journal-writer's.
    service: str
    tables: tuple[Table, ...]
    #: `make(suffix)` -> the projection instance named for a partition (`-p0-of-2`, or ""); None for one the
    #: service builds itself from its configuration (billing's prices and budgets).
    make: Callable[[str], Projection] | None = None
    #: Whether only one instance runs (partition 0), as for a projection that is not partitioned.
    single: bool = False
    #: SQL run before the tables' DDL (`CREATE SCHEMA IF NOT EXISTS graph`).
    prelude: str = ""
    #: SQL run after it (billing fills a summary table that a new version adds from its existing rows).
    postlude: str = ""

    @property
    def schema(self) -> str:
        """The DDL `cos up`, the services and replay apply (idempotent)."""
        return self.prelude + "\n".join(t.ddl() for t in self.tables) + self.postlude


_extra: list[tuple[str, Registration]] = []


def registrations() -> list[Registration]:
    """Every registration, in the order of their entry point names (then those a test added)."""
    found = sorted(entry_points(group=GROUP), key=lambda ep: ep.name)
    out: list[tuple[str, Registration]] = []
    for ep in found:
        reg = ep.load()
        if not isinstance(reg, Registration):
            raise TypeError(f"entry point {GROUP} {ep.name} = {ep.value} is not a Registration")
        out.append((ep.name, reg))
    out += _extra
    return [r for _, r in sorted(out, key=lambda item: item[0])]


@contextlib.contextmanager
def registered(order_name: str, registration: Registration) -> Iterator[Registration]:
    """Add `registration` for the duration of the block, as an entry point `order_name` would."""
    item = (order_name, registration)
    _extra.append(item)
    try:
        yield registration
    finally:
        _extra.remove(item)


def schemas(service: str | None = None) -> list[str]:
    """The schemas to apply, in order (all, or those of `service`'s projections)."""
    return [r.schema for r in registrations() if service is None or r.service == service]


def tables(service: str | None = None) -> list[Table]:
    return [t for r in registrations() if service is None or r.service == service for t in r.tables]


def projections(service: str, suffix: str = "", unpartitioned: bool = True) -> list[Projection]:
    """Instances of `service`'s projections for the partition `suffix` names; the single-instance ones only
    where `unpartitioned` (partition 0)."""
    out: list[Projection] = []
    for r in registrations():
        if r.service != service or r.make is None or (r.single and not unpartitioned):
            continue
        out.append(r.make("" if r.single else suffix))
    return out


def rebuilt(tables: Sequence[Table]) -> tuple[str, ...]:
    """The names of the tables a replay empties and rebuilds (a projection's `tables`)."""
    return tuple(t.name for t in tables if t.rebuilt)
