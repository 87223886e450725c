"""commonos.proto.config_files: msgspec's validation errors as one line naming the key path of the file."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import msgspec
import pytest

from commonos.proto.config_files import ConfigProblem, convert, decode_toml, key_path, one_line, toml_document
from commonos.proto.errors import ConfigError


class _Entry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    amount: Decimal | None = None
    count: int = 1
    when: datetime | None = None
    options: dict[str, Any] = {}


class _File(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    entry: list[_Entry] = []
    labels: list[str] = []


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"entries": []}, "entries: unknown key"),
        ({"entry": [{"name": "a"}, {"name": "b", "amont": 1}]}, "entry[1].amont: unknown key"),
        ({"entry": [{}]}, "entry[0].name: required key missing"),
        ({"entry": [{"name": "a", "amount": 3.5j}]}, "entry[0].amount: expected a decimal number, got "),
        ({"entry": [{"name": "a", "amount": True}]}, "entry[0].amount: expected a decimal number, got a boolean"),
        ({"entry": [{"name": "a", "amount": "lots"}]}, "entry[0].amount: invalid decimal string, got 'lots'"),
        ({"entry": [{"name": "a", "amount": "9" * 200 + "x"}]}, "entry[0].amount: invalid decimal string, got '999"),
        ({"entry": [{"name": "a", "count": "3"}]}, "entry[0].count: expected an integer, got a string"),
        ({"entry": [{"name": "a", "when": "soon"}]}, "entry[0].when: invalid RFC3339 encoded datetime, got 'soon'"),
        ({"entry": {"name": "a"}}, "entry: expected an array, got a table"),
        ({"entry": [1]}, "entry[0]: expected a table, got an integer"),
        ({"labels": ["a", 2]}, "labels[1]: expected a string, got an integer"),
        ({"entry": [{"name": "a", "x\ny": 1}]}, "entry[0]['x\\ny']: unknown key"),
        ({"a b": 1}, "['a b']: unknown key"),
    ],
)
def test_a_mismatch_names_the_key_path(document: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigProblem) as caught:
        convert(document, _File)
    assert str(caught.value).startswith(problem)
    assert len(str(caught.value).splitlines()) == 1
    assert isinstance(caught.value, ConfigError)


def test_a_part_of_a_file_is_named_from_its_own_key() -> None:
    with pytest.raises(ConfigProblem, match=r"^options\.entry\[0\]\.nam: unknown key$"):
        convert({"entry": [{"nam": "a"}]}, _File, prefix="options")
    with pytest.raises(ConfigProblem, match=r"^options\[0\]: expected a table, got an integer$"):
        convert([1], list[_Entry], prefix="options")


def test_decode_toml_reads_floats_as_decimals_when_asked() -> None:
    raw = b'[[entry]]\nname = "a"\namount = 0.1\n'
    decoded = decode_toml(raw, _File, error=ValueError, decimals=True)
    assert decoded.entry[0].amount == Decimal("0.1")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [(b"[[entry]\n", "invalid TOML: "), (b"caf\xe9 = 1\n", "not UTF-8: "), (b"a = " + b"[" * 5000, "invalid TOML: ")],
)
def test_a_file_that_is_not_toml_is_one_line(raw: bytes, problem: str) -> None:
    with pytest.raises(ConfigProblem) as caught:
        toml_document(raw)
    assert str(caught.value).startswith(problem) and len(str(caught.value).splitlines()) == 1


def test_decode_toml_raises_the_callers_error() -> None:
    class FileError(ConfigError):
        pass

    with pytest.raises(FileError, match=r"^f\.toml: entry\[0\]\.name: required key missing$"):
        decode_toml(b"[[entry]]\n", _File, error=lambda problem: FileError(f"f.toml: {problem}"))


def test_key_path_and_one_line() -> None:
    assert key_path("budget", 2, "limit_usd") == "budget[2].limit_usd"
    assert key_path("metrics", "a b") == "metrics['a b']"
    assert key_path(0, "x") == "[0].x"
    assert one_line("a\nb\r\u2028c\x85") == "a\\nb\\r\\u2028c\\x85"
    assert one_line("a\nb").splitlines() == ["a\\nb"]
