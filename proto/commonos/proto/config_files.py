"""The operator's configuration files (TOML) decoded into strict msgspec Structs, with one-line errors.

Each file kind declares its shape as Structs with ``forbid_unknown_fields=True``, so a misspelt key is an
error instead of being ignored. A problem is reported as ``<key path>: <what is wrong>``, the key path
written the way an operator reads the file: ``budget[2].limit_usd``, ``approval.tools``, ``colour``
(list positions count from 0). The caller puts the file's name in front, in its own error class (a
:class:`~commonos.proto.errors.ConfigError`).

Pure: decoding bytes the caller read; no I/O.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, TypeVar

import msgspec

from commonos.proto.errors import ConfigError

__all__ = ["ConfigProblem", "convert", "decode_toml", "key_path", "one_line", "problem_of", "toml_document"]

T = TypeVar("T")

#: Every character `str.splitlines` breaks a line at: a message keeps them escaped, on one line.
_LINE_BREAKS: Final = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_ESCAPES: Final = {ord(ch): ch.encode("unicode_escape").decode("ascii") for ch in _LINE_BREAKS}
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
_AT: Final = re.compile(r"(?P<text>.*) - at `\$(?P<path>.*)`", re.DOTALL)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<key>.*)`", re.DOTALL)
_MISSING: Final = re.compile(r"Object missing required field `(?P<key>.*)`", re.DOTALL)
_EXPECTED: Final = re.compile(r"Expected `(?P<expected>[^`]*)`(?P<rest>[^`]*?)(?:, got `(?P<got>[^`]*)`)?")
#: msgspec's names of types, in the words of a TOML file.
_TYPE_WORDS: Final = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean",
    "array": "an array",
    "object": "a table",
    "decimal": "a decimal number",
    "datetime": "a date-time",
    "date": "a date",
    "time": "a time",
}


class ConfigProblem(ConfigError):
    """What is wrong in a configuration file, in one line but without the file's name: whoever knows the
    file catches it and raises its own error naming it."""


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``), so that a message stays on one line."""
    return text.translate(_ESCAPES)


def key_path(*parts: str | int) -> str:
    """``("budget", 2, "limit_usd")`` -> ``budget[2].limit_usd``; an odd key is quoted: ``metrics['a b']``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _BARE_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _join(path: str, key: str) -> str:
    if _BARE_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _words(types: str) -> str:
    names = [name.strip() for name in types.split("|")]
    words = [_TYPE_WORDS.get(name, name) for name in names if name != "null"]
    return " or ".join(words or names)


_NO_VALUE: Final = object()
_STEP: Final = re.compile(r"\.([A-Za-z0-9_]+)|\[(\d+)\]")


def _value_at(document: object, path: str) -> object:
    """The value at msgspec's ``path`` (``.budget[0].limit_usd``) in ``document``; ``_NO_VALUE`` if the path
    goes through a table's key msgspec does not name (``[...]``)."""
    value = document
    position = 0
    while position < len(path):
        step = _STEP.match(path, position)
        if step is None:
            return _NO_VALUE
        key, index = step.groups()
        try:
            value = value[key] if key is not None else value[int(index)]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return _NO_VALUE
        position = step.end()
    return value


def problem_of(error: msgspec.ValidationError, prefix: str = "", document: object = _NO_VALUE) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.budget[0].limit_usd``` as ``budget[0].limit_usd:
    expected an integer, got a string``; ``prefix`` is the key path of the decoded value in its file. With
    the ``document`` that was decoded, a value msgspec does not quote (a bad decimal string) is quoted."""
    message = str(error)
    path = prefix
    inner = ""
    at = _AT.fullmatch(message)
    if at is not None:
        message = at["text"]
        inner = at["path"]  # ".budget[0].limit_usd", "[0]" or ""
        path = prefix + inner if prefix or inner.startswith("[") else inner.removeprefix(".")
    if (unknown := _UNKNOWN.fullmatch(message)) is not None:
        path, problem = _join(path, unknown["key"]), "unknown key"
    elif (missing := _MISSING.fullmatch(message)) is not None:
        path, problem = _join(path, missing["key"]), "required key missing"
    elif (expected := _EXPECTED.fullmatch(message)) is not None:
        problem = f"expected {_words(expected['expected'])}{expected['rest']}"
        if expected["got"]:
            problem += f", got {_words(expected['got'])}"
    else:
        problem = message[:1].lower() + message[1:]
        if message.startswith("Invalid") and "'" not in message and document is not _NO_VALUE:
            value = _value_at(document, inner)
            if value is not _NO_VALUE:
                shown = repr(value)
                problem += f", got {shown if len(shown) <= 80 else shown[:76] + '...'}"
    return one_line(f"{path}: {problem}" if path else problem)


def toml_document(raw: bytes, *, decimals: bool = False) -> dict[str, Any]:
    """The TOML document in ``raw``; ``decimals`` reads its floats as exact ``Decimal``. A problem raises
    :class:`ConfigProblem` (``not UTF-8: ...``, ``invalid TOML: ...``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigProblem(f"not UTF-8: {exc}") from None
    try:
        return tomllib.loads(text, parse_float=Decimal) if decimals else tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigProblem(one_line(f"invalid TOML: {exc}")) from None
    except RecursionError:
        raise ConfigProblem("invalid TOML: nested too deeply") from None


def convert(value: object, type_: type[T], *, prefix: str = "", strict: bool = True) -> T:
    """``value`` (a decoded document or a part of one, at key path ``prefix``) as ``type_``; a mismatch
    raises :class:`ConfigProblem`: ``<key path>: <problem>``."""
    try:
        return msgspec.convert(value, type_, strict=strict)
    except msgspec.ValidationError as exc:
        raise ConfigProblem(problem_of(exc, prefix, value)) from None
    except RecursionError:
        raise ConfigProblem(f"{prefix or 'the file'}: nested too deeply") from None


def decode_toml(raw: bytes, type_: type[T], *, error: Callable[[str], Exception], decimals: bool = False) -> T:
    """Decode a TOML file into ``type_``; any problem raises ``error(problem)``, ``problem`` being one line
    without the file's name (``error`` adds it)."""
    try:
        return convert(toml_document(raw, decimals=decimals), type_)
    except ConfigProblem as exc:
        raise error(str(exc)) from None
