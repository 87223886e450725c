"""OTLP attribute values as Python values, and the tags a resource's attributes give (pure: no I/O).

Values. An OTLP ``AnyValue`` becomes the Python value it holds (`any_value`): a string, bool, int,
float, bytes, a list of values (``array_value``) or a dict (``kvlist_value``). Clients are loose about
types — Claude Code sends token counts as ints but a tool's ``duration_ms`` as the string ``"10"``,
Codex sends every count as a string — so the readers (`integer`, `number`, `boolean`, `text`,
`decimal`) accept a value of the right type or a string spelling one, and give None otherwise.

Tags. A resource's attributes give the tags of every event of its records (`resource_tags`):

==============================================  =====================  ================================
resource attribute                              tag                    configured by
==============================================  =====================  ================================
``cos.tag.<key>=<value>``                       ``<key>:<value>``      always
``<key>=<value>``, ``<key>`` in the list        ``<key>:<value>``      `Source.tag_attributes`: default
                                                                       ``client,project,team``; the
                                                                       gateway reads
                                                                       ``COS_OTLP_TAG_ATTRIBUTES``
                                                                       (`tag_attributes_from_env`)
==============================================  =====================  ================================

So ``OTEL_RESOURCE_ATTRIBUTES=client=acme,project=site,cos.tag.cost-center=cc42`` gives
``client:acme``, ``cost-center:cc42``, ``project:site``. A bool or number value is written as text
(``true``, ``42``); tags are sorted, each once. Every tag is checked by `commonos.proto.tags.parse_tag`:
an invalid one raises `InvalidTag` naming the attribute, and the mapping refuses that resource's
records with that reason (OTLP partial success). What a token may give of them is
`commonos.otlp_gateway.common.Source.tags_of`'s (its own tags, the keys its senders may set). The vendor
modules add ``vendor:<vendor>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import msgspec
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from commonos.proto.tags import InvalidTag, parse_tag

#: Resource attributes with this prefix always map to a tag: ``cos.tag.<key>=<value>`` -> ``<key>:<value>``.
TAG_PREFIX: Final = "cos.tag."
#: Bare resource attribute keys mapped to tags when nothing else is configured.
DEFAULT_TAG_ATTRIBUTES: Final = ("client", "project", "team")
#: The environment variable listing the bare attribute keys (comma-separated; empty: none).
TAG_ATTRIBUTES_ENV: Final = "COS_OTLP_TAG_ATTRIBUTES"

_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
#: Tool arguments whose JSON is larger than this are not kept (the call is, with ``{}``).
MAX_ARGS_BYTES: Final = 64 * 1024
_JSON: Final = msgspec.json.Encoder()
_FIRST_INSTANT: Final = datetime.min.replace(tzinfo=UTC)
_LAST_INSTANT: Final = datetime.max.replace(tzinfo=UTC)


def any_value(value: AnyValue) -> Any:
    """The Python value an OTLP ``AnyValue`` holds (None when it holds none)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as a dict (a key given twice keeps its last value)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        # The two kinds nearly every attribute is, read here without a call (a gateway reads millions).
        value = pair.value
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[pair.key] = value.string_value
        elif kind == "int_value":
            out[pair.key] = value.int_value
        else:
            out[pair.key] = any_value(value)
    return out


def text(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def integer(value: Any) -> int | None:
    """An int, or a string or integral float spelling one; None for anything else (bools included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    return None


def count(value: Any) -> int:
    """A token count: `integer`, and 0 for a missing or negative one."""
    number = integer(value)
    return number if number is not None and number > 0 else 0


def number(value: Any) -> float | None:
    """A finite float from a number or a string spelling one; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return result if math.isfinite(result) else None


def decimal(value: Any) -> Decimal | None:
    """An exact decimal: a string as written, a float as its shortest repr (``0.1`` -> ``Decimal('0.1')``)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        result = Decimal(value.strip()) if isinstance(value, str) else Decimal(repr(value))
    except (InvalidOperation, ValueError, TypeError):
        return None
    return result if result.is_finite() else None


def boolean(value: Any) -> bool | None:
    """A bool, or the strings ``true`` / ``false`` (any case); None otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp string (``2026-12-01T20:04:49.635Z``) as an aware datetime; None otherwise.

    None too for an instant no UTC datetime strictly inside datetime's range holds (year 1 east of UTC,
    year 9999 west of it, the first or last instant): no row can hold it, billing refuses it.
    """
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        return None
    return None if utc in (_FIRST_INSTANT, _LAST_INSTANT) else moment


def before(moment: datetime, milliseconds: Any) -> datetime:
    """`moment` less a duration in milliseconds (a number or a string spelling one); `moment` itself when the
    duration is missing, not above 0, or reaches outside datetime's range."""
    duration = number(milliseconds)
    if duration is None or duration <= 0:
        return moment
    try:
        return moment - timedelta(milliseconds=duration)
    except OverflowError:
        return moment


def from_nanos(nanos: int) -> datetime | None:
    """Nanoseconds since the epoch (OTLP's ``time_unix_nano``) as an aware datetime; None for 0 (unset)."""
    if nanos <= 0:
        return None
    # OTLP's times are fixed64: at most 2**64 - 1 ns, in the year 2554, well within datetime's range.
    return _EPOCH + timedelta(microseconds=nanos // 1000)


def json_object(value: Any, wrap: str | None = None) -> dict[str, Any]:
    """Tool arguments as a stored event holds them: a JSON object, from an OTLP map or a string of JSON.

    A string that is no JSON, or a value that is no object, becomes ``{wrap: value}`` (without `wrap`: ``{}``).
    The object is what its own JSON decodes to (bytes as base64, a float JSON cannot hold as null), so the
    event stored is the event made; arguments over `MAX_ARGS_BYTES` of JSON are left out (``{}``).
    """
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            pass
        else:
            if isinstance(value, dict):
                return value if len(_JSON.encode(value)) <= MAX_ARGS_BYTES else {}
    if not isinstance(value, dict):
        if wrap is None:
            return {}
        value = {wrap: value}
    try:
        encoded = _JSON.encode(value)
    except (TypeError, ValueError, msgspec.EncodeError):
        return {}
    if len(encoded) > MAX_ARGS_BYTES:
        return {}
    decoded: dict[str, Any] = msgspec.json.decode(encoded)
    return decoded


def _tag_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return None


def resource_tags(
    resource: Mapping[str, Any], tag_attributes: Sequence[str] = DEFAULT_TAG_ATTRIBUTES
) -> tuple[str, ...]:
    """The tags of a resource's attributes (see the module's table), sorted, each once.

    Raises `InvalidTag` (its message naming the attribute) when an attribute gives an invalid tag,
    or a value that is not a string, bool or number.
    """
    found: set[str] = set()
    for key, value in resource.items():
        if key.startswith(TAG_PREFIX):
            tag_key = key[len(TAG_PREFIX) :]
        elif key in tag_attributes:
            tag_key = key
        else:
            continue
        written = _tag_value(value)
        tag = f"{tag_key}:{written if written is not None else ''}"
        try:
            if written is None:
                raise InvalidTag(tag, "the attribute's value is not a string, bool or number")
            found.add(parse_tag(tag))
        except InvalidTag as exc:
            raise InvalidTag(tag, f"{exc.rule} (resource attribute {key!r})") from None
    return tuple(sorted(found))


def tag_attributes_from_env(value: str | None) -> tuple[str, ...]:
    """`COS_OTLP_TAG_ATTRIBUTES` parsed: unset -> the default keys; ``""`` -> none; else its comma-separated keys."""
    if value is None:
        return DEFAULT_TAG_ATTRIBUTES
    return tuple(dict.fromkeys(key.strip() for key in value.split(",") if key.strip()))
