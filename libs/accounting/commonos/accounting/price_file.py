"""The operator price file: TOML, USD per million tokens, decoded into strict Structs.

::

    [[price]]
    provider = "anthropic"         # optional; our provider name or its genai-prices id; absent = any
    model = "claude-sonnet-4-5"    # exact model id or a glob ("claude-sonnet-4*"), case-insensitive
    effective_from = 2026-01-01    # optional; a TOML date (UTC midnight) or date-time, or an ISO string
    input_mtok = "3.00"            # required; a number or a decimal string, read as an exact Decimal
    output_mtok = "15.00"          # required
    cache_read_mtok = "0.30"       # optional, default input_mtok
    cache_write_5m_mtok = "3.75"   # optional, default input_mtok
    cache_write_1h_mtok = "6.00"   # optional, default 2x input_mtok for provider "anthropic" when
                                   # cache_write_5m_mtok is given, else cache_write_5m_mtok

Any other key is an error. Every problem is a :class:`PriceFileError`, one line naming the file, the key
(``price[3].input_mtok``, positions from 0) and what is wrong.

The most specific (provider, model) key that matches a call wins: an exact model id beats a glob, a glob with
more literal characters beats a shorter one, a named provider beats none. Within that key the entry with the
latest ``effective_from`` <= the call time applies; if all of them start later, the next key is tried
(:func:`override_groups`).
"""

from __future__ import annotations

import fnmatch
import hashlib
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

from commonos.accounting.rates import MAX_PRICE_MTOK, Rates, is_anthropic, rates_from_mtok
from commonos.proto.config_files import decode_toml, key_path
from commonos.proto.errors import ConfigError

__all__ = [
    "OverrideGroup",
    "PriceEntry",
    "PriceFile",
    "PriceFileError",
    "load_price_file",
    "override_groups",
    "parse_price_file",
]

_EARLIEST = datetime.min.replace(tzinfo=UTC)


class PriceFileError(ConfigError):
    """An operator price file that cannot be used; one line naming the file, the key and the problem."""


class _PriceTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``[[price]]`` as written in the file."""

    model: str
    input_mtok: Decimal
    output_mtok: Decimal
    provider: str | None = None
    #: A TOML date or date-time, or an ISO string of either: three types no msgspec union holds, so this
    #: one is checked after decoding (`_effective_from`).
    effective_from: Any = None
    cache_read_mtok: Decimal | None = None
    cache_write_5m_mtok: Decimal | None = None
    cache_write_1h_mtok: Decimal | None = None


class _PriceDocument(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    price: list[_PriceTable] = []


@dataclass(frozen=True, slots=True)
class PriceEntry:
    """One ``[[price]]`` entry of an operator price file (prices in USD per million tokens)."""

    index: int  # 1-based position in the file, for the `detail` of a cost
    provider: str | None
    model: str  # lower-cased exact id or glob
    effective_from: datetime  # aware; the beginning of time when the file gives none
    input_mtok: Decimal
    output_mtok: Decimal
    cache_read_mtok: Decimal | None
    cache_write_5m_mtok: Decimal | None
    cache_write_1h_mtok: Decimal | None
    rates: Rates = field(repr=False, compare=False)

    @property
    def is_glob(self) -> bool:
        return any(ch in self.model for ch in "*?[")


@dataclass(frozen=True, slots=True)
class PriceFile:
    """A loaded operator price file; build it with :func:`load_price_file`."""

    name: str
    sha256: str
    entries: tuple[PriceEntry, ...]


def load_price_file(path: str | Path) -> PriceFile:
    """Read and validate an operator price file; any problem raises :class:`PriceFileError`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PriceFileError(f"{path}: cannot read price file: {exc.strerror or exc}") from exc
    return parse_price_file(raw, name=str(path))


def parse_price_file(raw: bytes, *, name: str) -> PriceFile:
    """Validate the bytes of a price file; ``name`` is used in messages and in ``source``."""

    def error(problem: str) -> PriceFileError:
        return PriceFileError(f"{name}: {problem}")

    # decimals: a TOML 0.3 is exactly 0.3, never a binary float.
    document = decode_toml(raw, _PriceDocument, error=error, decimals=True)
    entries = tuple(_entry(table, index, error) for index, table in enumerate(document.price))
    seen: dict[tuple[str | None, str, datetime], int] = {}
    for position, entry in enumerate(entries):
        key = (entry.provider, entry.model, entry.effective_from)
        if key in seen:
            raise error(
                f"{key_path('price', position)}: same provider, model and effective_from as "
                f"{key_path('price', seen[key])}"
            )
        seen[key] = position
    return PriceFile(name=Path(name).name, sha256=hashlib.sha256(raw).hexdigest(), entries=entries)


def _entry(table: _PriceTable, position: int, error: Callable[[str], PriceFileError]) -> PriceEntry:
    def where(key: str) -> str:
        return key_path("price", position, key)

    model = table.model.strip()
    if not model:
        raise error(f"{where('model')}: must not be empty")
    provider = table.provider
    if provider is not None:
        provider = provider.strip().lower()
        if not provider:
            raise error(f"{where('provider')}: must not be empty")

    def price(key: str) -> Decimal | None:
        amount: Decimal | None = getattr(table, key)
        if amount is None:
            return None
        if not amount.is_finite() or amount < 0:
            raise error(f"{where(key)}: must be a finite non-negative number, got {amount}")
        if amount > MAX_PRICE_MTOK:
            raise error(
                f"{where(key)}: {amount} USD per million tokens is beyond any real price (at most {MAX_PRICE_MTOK})"
            )
        return amount

    input_mtok = price("input_mtok")
    output_mtok = price("output_mtok")
    assert input_mtok is not None and output_mtok is not None  # required fields of the Struct
    cache_read = price("cache_read_mtok")
    cache_write_5m = price("cache_write_5m_mtok")
    cache_write_1h = price("cache_write_1h_mtok")
    return PriceEntry(
        index=position + 1,
        provider=provider,
        model=model.lower(),
        effective_from=_effective_from(table.effective_from, where("effective_from"), error),
        input_mtok=input_mtok,
        output_mtok=output_mtok,
        cache_read_mtok=cache_read,
        cache_write_5m_mtok=cache_write_5m,
        cache_write_1h_mtok=cache_write_1h,
        rates=rates_from_mtok(
            input_mtok=input_mtok,
            output_mtok=output_mtok,
            cache_read_mtok=cache_read,
            cache_write_mtok=None,
            cache_write_5m_mtok=cache_write_5m,
            cache_write_1h_mtok=cache_write_1h,
            derive_1h_from_input=is_anthropic(provider),
        ),
    )


def _effective_from(value: object, where: str, error: Callable[[str], PriceFileError]) -> datetime:
    if value is None:
        return _EARLIEST
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise error(f"{where}: not an ISO date or date-time: {value!r}") from None
    if isinstance(value, datetime):
        # A date-time without offset is UTC, like genai-prices' naive timestamps.
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=UTC)
    raise error(f"{where}: expected a date or date-time, got {value!r}")


@dataclass(frozen=True, slots=True)
class OverrideGroup:
    """All entries of one (provider, model) key, by ``effective_from``."""

    starts: tuple[datetime, ...]
    entries: tuple[PriceEntry, ...]

    def entry_at(self, at: datetime) -> PriceEntry | None:
        position = bisect_right(self.starts, at)
        return self.entries[position - 1] if position else None


def override_groups(
    price_file: PriceFile, provider: str, genai_id: str | None, model: str
) -> tuple[OverrideGroup, ...]:
    """The groups of entries matching this provider and model, most specific first."""
    by_key: dict[tuple[str | None, str], list[PriceEntry]] = {}
    for entry in price_file.entries:
        if entry.provider is not None and entry.provider not in (provider, genai_id):
            continue
        if entry.model != model and not (entry.is_glob and fnmatch.fnmatchcase(model, entry.model)):
            continue
        by_key.setdefault((entry.provider, entry.model), []).append(entry)

    def specificity(key: tuple[str | None, str]) -> tuple[bool, int, bool]:
        key_provider, pattern = key
        literal = sum(ch not in "*?[]" for ch in pattern)
        return (pattern == model, literal, key_provider is not None)

    groups = []
    for key in sorted(by_key, key=specificity, reverse=True):
        entries = sorted(by_key[key], key=lambda entry: entry.effective_from)
        groups.append(OverrideGroup(tuple(e.effective_from for e in entries), tuple(entries)))
    return tuple(groups)
