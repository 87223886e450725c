"""Tables declared once: a projection's table is a `Table`, and everything about it follows from that.

A `Table` names its row type, a msgspec Struct whose fields are the table's columns in order (a field holding
a Struct, such as `commonos.accounting.usage.TokenUsage`, contributes that Struct's fields; `order` can place
them among the others), its key, what an insert does on a conflict (`DoNothing`, `Upsert`, `Checked`), its
indexes, the role that owns it and the roles that may read it. From it follow:

* `ddl()`: its `CREATE TABLE IF NOT EXISTS` (columns typed from the fields: `uuid.UUID` is uuid, `str`
  text, `int` integer unless `types` says bigint, `X | None` nullable, `tuple[str, ...]` text[]), then the
  columns a later version added (`added`, `ADD COLUMN IF NOT EXISTS`) and its indexes;
* `insert_one()` / `insert_bulk()`: the single-row insert (`VALUES ($1::uuid, ...)`) and the bulk one (an
  `unnest` of one typed array per column), both ending in the conflict policy, with `row_args` / `bulk_args`
  turning Structs into their arguments. An `Upsert` may name the stored row (`alias`, for its expressions:
  `coalesce(EXCLUDED.title, s.title)`) and update only where a condition holds (`where`); a bulk insert
  cannot update one row twice (PostgreSQL refuses it), so rows that may repeat a key in one batch go one
  by one (`insert_one` with `executemany`);
* `grants()`: its block of `deploy/postgres/roles.sql` (owner, privileges taken back, reads granted,
  row-level security), generated for every registered table by `roles_sql` and kept equal to the file by a
  test.

`partition_by` names a time column: the table is then partitioned by month on it
(`commonos.runtime.partitions`), its primary key and every conflict target gain that column (a unique index of a
partitioned table must hold the partition key), and its DDL refuses an unpartitioned table of the same name left
by an older version, saying how to move it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import types
import typing
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from functools import cached_property
from typing import Any, Final

import msgspec

from commonos.proto.text import escape_nul
from commonos.runtime import partitions

__all__ = [
    "ANALYST",
    "BILLING",
    "CONSOLE",
    "JOURNAL_WRITER",
    "LOOP",
    "ROLES",
    "Checked",
    "Column",
    "DoNothing",
    "Read",
    "Table",
    "Upsert",
    "by_profile",
    "one_of",
    "roles_sql",
]

#: The database roles of deploy/postgres/bootstrap.sql.
JOURNAL_WRITER: Final = "cos_journal_writer"
BILLING: Final = "cos_billing"
LOOP: Final = "cos_loop"
CONSOLE: Final = "cos_console"
ANALYST: Final = "cos_analyst"
ROLES: Final = (JOURNAL_WRITER, BILLING, LOOP, CONSOLE, ANALYST)


def by_profile(column: str = "profile_id") -> str:
    """An analyst's row filter: the rows of the profiles granted to the analyst (`analyst_grants`)."""
    return f"{column} IN (SELECT profile_id FROM analyst_grants WHERE role_name = current_user)"


@dataclass(frozen=True)
class Read:
    """A role that may read the table; `rows` is its row-level security filter (`None`: every row)."""

    role: str
    rows: str | None = None
    #: The policy's name (a filter's own name, `analyst_by_profile`; otherwise `<role>_reads_all`).
    policy: str | None = None

    @property
    def policy_name(self) -> str:
        if self.policy:
            return self.policy
        short = self.role.removeprefix("cos_")
        return f"{short}_reads_all" if self.rows is None else f"{short}_by_profile"


# --- conflict policies --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoNothing:
    """`ON CONFLICT (<key>) DO NOTHING`: the first row of a key wins (an event applied again changes nothing)."""

    on: tuple[str, ...] | None = None

    def sql(self, table: Table) -> str:
        return f"ON CONFLICT ({', '.join(self.on or table.conflict_key)}) DO NOTHING"


@dataclass(frozen=True)
class Upsert:
    """`ON CONFLICT (<key>) DO UPDATE SET` the named columns from the new row (or by the given expressions)."""

    columns: tuple[str, ...]
    #: Expressions for some of them (`greatest(t.updated_at, EXCLUDED.updated_at)`); the rest take EXCLUDED's.
    values: Mapping[str, str] = field(default_factory=dict)
    #: The stored row's name in the expressions and `where` (`INSERT INTO <table> AS <alias>`).
    alias: str | None = None
    #: Update only where this holds (`EXCLUDED.total_tokens > m.total_tokens`); otherwise the row stays.
    where: str | None = None

    def sql(self, table: Table) -> str:
        sets = ", ".join(f"{c} = {self.values.get(c, f'EXCLUDED.{c}')}" for c in self.columns)
        where = f" WHERE {self.where}" if self.where else ""
        return f"ON CONFLICT ({', '.join(table.conflict_key)}) DO UPDATE SET {sets}{where}"


@dataclass(frozen=True)
class Checked:
    """`ON CONFLICT (<key>) DO NOTHING RETURNING <key>`: the insert returns the keys it added, so the caller
    tells new rows from rows already there; `where` (over the bulk form's `u.<column>`) skips rows."""

    where: str | None = None

    def sql(self, table: Table) -> str:
        return f"ON CONFLICT ({', '.join(table.conflict_key)}) DO NOTHING RETURNING {', '.join(table.key)}"


Conflict = DoNothing | Upsert | Checked


# --- columns -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    #: The PostgreSQL type.
    type: str
    nullable: bool
    #: What follows the type and NOT NULL in the DDL (DEFAULT, CHECK, REFERENCES).
    details: str = ""
    #: Where the value is in the row: the field's name, or (field, nested field) for a Struct's field.
    path: tuple[str, ...] = ()

    def ddl(self) -> str:
        name = f'"{self.name}"' if self.name in _RESERVED else self.name
        parts = [name, self.type]
        if not self.nullable:
            parts.append("NOT NULL")
        if self.details:
            parts.append(self.details)
        return " ".join(parts)


_RESERVED: Final = frozenset({"timestamp", "user", "order", "group", "limit"})

_TYPES: Final[dict[object, str]] = {
    uuid.UUID: "uuid",
    str: "text",
    int: "integer",
    bool: "boolean",
    float: "double precision",
    decimal.Decimal: "numeric",
    dt.datetime: "timestamptz",
    dt.date: "date",
}


def _pg_type(hint: object) -> tuple[str | None, bool]:
    """(PostgreSQL type, nullable) of a field's annotation; type None for a nested Struct."""
    nullable = False
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"a column holds one type, not {hint!r}")
        hint = args[0]
        origin = typing.get_origin(hint)
    if origin in (tuple, list) and typing.get_args(hint)[:1] == (str,):
        return "text[]", nullable
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return None, nullable
    if hint in _TYPES:
        return _TYPES[hint], nullable
    if isinstance(hint, type) and issubclass(hint, str):  # a StrEnum
        return "text", nullable
    if hint is Any or origin is dict:
        return "jsonb", nullable
    raise TypeError(f"no column type for {hint!r}")


def _fields(row: type) -> tuple[str, ...]:
    """A Struct's fields, or a NamedTuple's."""
    fields = getattr(row, "__struct_fields__", None)
    return tuple(fields if fields is not None else row._fields)  # type: ignore[attr-defined]


def struct_columns(
    row: type, types: Mapping[str, str], details: Mapping[str, str], omit: frozenset[str]
) -> tuple[Column, ...]:
    out: list[Column] = []
    hints = typing.get_type_hints(row)
    for name in _fields(row):
        pg, nullable = _pg_type(hints[name])
        if pg is None:
            inner = typing.get_type_hints(hints[name])
            for sub in _fields(hints[name]):
                if sub in omit:
                    continue
                sub_pg, sub_null = _pg_type(inner[sub])
                assert sub_pg is not None, f"{row.__name__}.{name}.{sub}: one level of nesting only"
                out.append(Column(sub, types.get(sub, sub_pg), sub_null, details.get(sub, ""), (name, sub)))
            continue
        if name in omit:
            continue
        out.append(Column(name, types.get(name, pg), nullable, details.get(name, ""), (name,)))
    return tuple(out)


def one_of(column: str, values: Iterable[str]) -> str:
    """`CHECK (<column> IN ('a', 'b', ...))`: a text column holding one of `values` (an enum's members, in
    their order: the enum declares them once, the table follows it)."""
    quoted = ", ".join("'" + str(v).replace("'", "''") + "'" for v in values)
    return f"CHECK ({column} IN ({quoted}))"


# --- the table -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Table:
    """One table, declared once (see the module's docstring)."""

    #: `name` or `schema.name`.
    name: str
    #: A msgspec Struct (or a NamedTuple) whose fields are the columns, in order.
    row: type
    _: KW_ONLY
    owner: str
    #: The primary key (and the conflict target): most tables' rows are named by their `id`.
    key: tuple[str, ...] = ("id",)
    conflict: Conflict = field(default_factory=DoNothing)
    #: Column types other than the field's own (`bigint` for a count).
    types: Mapping[str, str] = field(default_factory=dict)
    #: Per column, what follows its type in the DDL: `DEFAULT 0 CHECK (depth >= 0)`, `REFERENCES ...`.
    details: Mapping[str, str] = field(default_factory=dict)
    #: Columns the row does not carry, written as DDL (a generated column, `recorded_at ... DEFAULT now()`).
    extra: tuple[str, ...] = ()
    #: Fields of the row (or of a Struct in it) that are not columns.
    omit: frozenset[str] = frozenset()
    #: The columns in this order, when it is not the fields' (a Struct's columns placed among the row's own):
    #: every column, once.
    order: tuple[str, ...] = ()
    #: Table constraints (`UNIQUE (session_id, seq)`, `CHECK (...)`); the key is the primary key unless
    #: `primary_key` is given (`CONSTRAINT ... PRIMARY KEY ... DEFERRABLE`).
    constraints: tuple[str, ...] = ()
    primary_key: str | None = None
    #: Columns added after the table was first created (`ADD COLUMN IF NOT EXISTS`, in the DDL's end).
    added: tuple[str, ...] = ()
    #: Columns the row does not carry that a later version added (`name: definition`, such as a generated
    #: `tsvector GENERATED ALWAYS AS (...) STORED`): `ADD COLUMN IF NOT EXISTS`, before the indexes, so that an
    #: existing table gains them and an index may name them.
    added_extra: Mapping[str, str] = field(default_factory=dict)
    #: `name: definition` of each index (`(profile_id, created_at)`, `USING gin (tags)`, `UNIQUE (...)`).
    indexes: Mapping[str, str] = field(default_factory=dict)
    readers: tuple[Read, ...] = ()
    #: Whether `cos replay` empties and rebuilds it and the contract suite compares it (a record of
    #: operators' runs, such as billing's reprices, is not rebuilt from the stream).
    rebuilt: bool = True
    #: The time column its rows are partitioned by, one partition a month (`commonos.runtime.partitions`);
    #: None: one table. The key stays the rows' name; the primary key and conflict targets add this column.
    partition_by: str | None = None
    #: An accounting record (billing's `model_calls`): its months are dropped only by a retention of its own
    #: (`cos retention --model-calls-keep-months`), never with the rest.
    accounting: bool = False
    #: For a table that is not partitioned: the time column by whose month a row expires under retention
    #: (`commonos.runtime.retention.expire`), deleted with every row that references it ON DELETE CASCADE
    #: (the session graph's sessions and everything of theirs). Rows without a time are kept.
    expires_by: str | None = None
    #: For a rollup of a partitioned table's rows (billing's `session_costs` of `model_calls`): that table's name ->
    #: the statements that take a month of its rows out of this one when retention drops the month
    #: (`commonos.runtime.retention.run`). They run in the transaction that drops the month, after it was
    #: detached (so that no writer reaches its rows any more), with `{month}` naming its table, which then holds
    #: exactly the rows that left; in the order of the registered tables, each table's in its own order.
    drops: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: A comment written above the table in the DDL.
    doc: str = ""

    @cached_property
    def columns(self) -> tuple[Column, ...]:
        cols = struct_columns(self.row, self.types, self.details, self.omit)
        if self.order:
            by_name = {c.name: c for c in cols}
            if sorted(self.order) != sorted(by_name):
                raise TypeError(f"{self.name}: the order names {sorted(self.order)}, the columns are {sorted(by_name)}")
            cols = tuple(by_name[name] for name in self.order)
        names = [c.name for c in cols]
        if self.partition_by is not None and self.partition_by in self.added:
            raise TypeError(f"{self.name}: the partition column {self.partition_by!r} cannot be an added column")
        if self.partition_by is not None and self.expires_by is not None:
            raise TypeError(f"{self.name}: a partitioned table expires by its partitions, not by expires_by")
        partition = (self.partition_by,) if self.partition_by else ()
        expires = (self.expires_by,) if self.expires_by else ()
        for name in (*self.key, *self.added, *self.types, *self.details, *partition, *expires):
            if name not in names:
                raise TypeError(f"{self.name}: {name!r} is not a column of {self.row.__name__}")
        return cols

    @property
    def conflict_key(self) -> tuple[str, ...]:
        """The primary key's columns: the key, and the partition column of a partitioned table."""
        if self.partition_by is None or self.partition_by in self.key:
            return self.key
        return (*self.key, self.partition_by)

    @property
    def schema(self) -> str:
        return self.name.rpartition(".")[0] or "public"

    @property
    def bare_name(self) -> str:
        return self.name.rpartition(".")[2]

    # -- DDL

    def ddl(self) -> str:
        created = [c for c in self.columns if c.name not in self.added]
        lines = [c.ddl() for c in created] + list(self.extra)
        lines.append(self.primary_key or f"PRIMARY KEY ({', '.join(self.conflict_key)})")
        lines += self.constraints
        body = ",\n    ".join(lines)
        out = "".join(f"-- {line}\n" for line in self.doc.splitlines())
        if self.partition_by is None:
            out += f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {body}\n);\n"
        else:
            out += partitions.refuse_old_layout_sql(self.name)
            out += f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {body}\n)"
            out += f" PARTITION BY RANGE ({self.partition_by});\n"
        for column in self.columns:
            if column.name in self.added:
                out += f"ALTER TABLE {self.name} ADD COLUMN IF NOT EXISTS {column.ddl()};\n"
        for name, definition in self.added_extra.items():
            out += f"ALTER TABLE {self.name} ADD COLUMN IF NOT EXISTS {name} {definition};\n"
        for index, definition in self.indexes.items():
            unique = "UNIQUE " if definition.startswith("UNIQUE ") else ""
            out += f"CREATE {unique}INDEX IF NOT EXISTS {index} ON {self.name} {definition.removeprefix(unique)};\n"
        if self.partition_by is not None:
            out += partitions.ahead_sql(self.name)
        return out

    # -- writing rows

    def _conflict(self) -> str:
        return self.conflict.sql(self)

    def _target(self) -> str:
        """The table an insert names, with the alias its conflict policy gives the stored row."""
        alias = self.conflict.alias if isinstance(self.conflict, Upsert) else None
        return f"{self.name} AS {alias}" if alias else self.name

    def insert_one(self) -> str:
        """`INSERT ... VALUES ($1::type, ...) <conflict>`, the arguments being `row_args(row)`."""
        names = ", ".join(c.name for c in self.columns)
        values = ", ".join(_one(c, i) for i, c in enumerate(self.columns, 1))
        return f"INSERT INTO {self._target()} ({names}) VALUES ({values}) {self._conflict()}"

    def insert_bulk(self) -> str:
        """`INSERT ... SELECT ... FROM unnest($1::type[], ...) AS u(columns) <conflict>`, one array per column
        (`bulk_args(rows)`): one round trip for any number of rows."""
        names = ", ".join(c.name for c in self.columns)
        arrays = ", ".join(_array(c, i) for i, c in enumerate(self.columns, 1))
        values = ", ".join(_from_array(c) for c in self.columns)
        where = self.conflict.where if isinstance(self.conflict, Checked) and self.conflict.where else None
        return (
            f"INSERT INTO {self._target()} ({names}) SELECT {values} FROM unnest({arrays}) AS u({names})"
            + (f" WHERE {where}" if where else "")
            + f" {self._conflict()}"
        )

    @cached_property
    def _getters(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        return tuple((c.path, c.type) for c in self.columns)

    def row_args(self, row: Any) -> list[Any]:
        """The arguments of `insert_one` for one row (strings escaped, `commonos.proto.text`)."""
        out: list[Any] = []
        for path, pg in self._getters:
            value: Any = row
            for part in path:
                value = getattr(value, part)
            out.append(_arg(value, pg, bulk=False))
        return out

    def bulk_args(self, rows: Sequence[Any]) -> list[list[Any]]:
        """The arrays of `insert_bulk` for `rows`, one per column."""
        out: list[list[Any]] = []
        for path, pg in self._getters:
            column: list[Any] = []
            for row in rows:
                value: Any = row
                for part in path:
                    value = getattr(value, part)
                column.append(_arg(value, pg, bulk=True))
            out.append(column)
        return out

    # -- privileges

    def grants(self) -> str:
        """This table's part of deploy/postgres/roles.sql (applied only where the table exists)."""
        others = [r for r in ("PUBLIC", *ROLES) if r != self.owner]
        lines = [
            f"ALTER TABLE {self.name} OWNER TO {self.owner};",
            f"REVOKE ALL ON {self.name} FROM {', '.join(others)};",
        ]
        if self.partition_by is not None:
            # A partition's owner is whoever made it (the schema's applier, a writer); privileges and row-level
            # security are the parent's, read through it. Its months belong to the table's owner too, so that
            # the owner's `cos retention` can drop them.
            lines += [
                "FOR part IN SELECT inhrelid::regclass FROM pg_inherits",
                f"        WHERE inhparent = '{self.name}'::regclass LOOP",
                f"    EXECUTE format('ALTER TABLE %s OWNER TO {self.owner}', part);",
                "END LOOP;",
            ]
        for reader in self.readers:
            lines.append(f"GRANT SELECT ON {self.name} TO {reader.role};")
        if any(r.rows is not None for r in self.readers):
            lines.append(f"ALTER TABLE {self.name} ENABLE ROW LEVEL SECURITY;")
            for reader in self.readers:
                policy = reader.policy_name
                lines.append(f"DROP POLICY IF EXISTS {policy} ON {self.name};")
                using = reader.rows or "true"
                lines.append(f"CREATE POLICY {policy} ON {self.name} FOR SELECT TO {reader.role} USING ({using});")
        body = "".join(f"        {line}\n" for line in lines)
        return f"    IF to_regclass('{self.schema}.{self.bare_name}') IS NOT NULL THEN\n{body}    END IF;\n"


def _one(column: Column, index: int) -> str:
    return f"${index}::text::jsonb" if column.type == "jsonb" else f"${index}::{column.type}"


def _array(column: Column, index: int) -> str:
    if column.type in ("jsonb", "text[]"):
        return f"${index}::text[]"
    return f"${index}::{column.type}[]"


def _from_array(column: Column) -> str:
    if column.type == "jsonb":
        return f"u.{column.name}::jsonb"
    if column.type == "text[]":
        return f"u.{column.name}::text[]"
    return f"u.{column.name}"


def _arg(value: Any, pg: str, *, bulk: bool) -> Any:
    if value is None:
        return None
    if pg == "text":
        return escape_nul(str(value))
    if pg == "text[]":
        items = [escape_nul(v) for v in value]
        # A text[] in an array of arrays would have to be rectangular: it travels as an array literal (the tags
        # it holds never carry quotes, commas, braces or spaces).
        return "{" + ",".join(items) + "}" if bulk else items
    return value


# --- tables every projection has ----------------------------------------------------------------------------


class PositionRow(msgspec.Struct, frozen=True):
    """Where a consumer of the stream got to, written in the same transaction as its rows."""

    consumer: str
    stream_seq: int
    updated_at: dt.datetime


def positions_table(name: str, owner: str, readers: tuple[Read, ...] = ()) -> Table:
    """A projection's position table (`Projection.position_table`); replay resets its rows, never empties it."""
    return Table(
        name,
        PositionRow,
        key=("consumer",),
        owner=owner,
        types={"stream_seq": "bigint"},
        details={"updated_at": "DEFAULT now()"},
        readers=readers,
        rebuilt=False,
    )


# --- roles.sql -----------------------------------------------------------------------------------------------

BEGIN_GENERATED: Final = "-- BEGIN generated from the table declarations (commonos.runtime.tables.roles_sql)"
END_GENERATED: Final = "-- END generated"


def roles_sql(tables: Sequence[Table]) -> str:
    """The generated section of deploy/postgres/roles.sql: each table's owner, privileges and policies, each
    schema other than public owned by the tables' owner and usable by their readers."""
    declare = ["DECLARE part regclass;"] if any(t.partition_by for t in tables) else []
    out = [BEGIN_GENERATED, "DO $$", *declare, "BEGIN"]
    schemas: dict[str, list[Table]] = {}
    for table in tables:
        if table.schema != "public":
            schemas.setdefault(table.schema, []).append(table)
    for schema, members in schemas.items():
        owner = members[0].owner
        readers = sorted({r.role for t in members for r in t.readers})
        out.append(f"    IF to_regnamespace('{schema}') IS NOT NULL THEN")
        out.append(f"        ALTER SCHEMA {schema} OWNER TO {owner};")
        out.append(f"        REVOKE ALL ON SCHEMA {schema} FROM PUBLIC;")
        out += [f"        GRANT USAGE ON SCHEMA {schema} TO {role};" for role in readers]
        out.append("    END IF;")
    body = "".join(t.grants() for t in tables)
    out.append(body.rstrip("\n"))
    out += ["END", "$$;", END_GENERATED]
    return "\n".join(out) + "\n"
