"""deploy/postgres/roles.sql's section of table privileges is what the registered table declarations give
(`commonos.runtime.tables.roles_sql`); when it is not, the test prints the section to put there."""

from __future__ import annotations

from commonos.runtime import registry
from commonos.runtime.tables import BEGIN_GENERATED, END_GENERATED, roles_sql
from tests.deploy.conftest import DEPLOY


def generated_section(text: str) -> str:
    start = text.index(BEGIN_GENERATED)
    end = text.index(END_GENERATED, start) + len(END_GENERATED) + 1
    return text[start:end]


def test_roles_sql_grants_what_the_table_declarations_say() -> None:
    want = roles_sql(registry.tables())
    have = generated_section((DEPLOY / "postgres" / "roles.sql").read_text())
    assert have == want, (
        "deploy/postgres/roles.sql (and its copy deploy/k8s/base/config/postgres/roles.sql) differs from the "
        f"table declarations; replace its generated section with:\n{want}"
    )


def test_every_registered_table_is_owned_by_a_service_and_named_once() -> None:
    tables = registry.tables()
    names = [t.name for t in tables]
    assert len(names) == len(set(names)), names
    assert {t.owner for t in tables} <= {"cos_journal_writer", "cos_billing"}
    # The schema list `cos up` applies holds every table's DDL, in the registrations' order.
    schemas = "\n".join(registry.schemas())
    for table in tables:
        assert f"CREATE TABLE IF NOT EXISTS {table.name} (" in schemas
