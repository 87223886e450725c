"""Cost tables as CSV that no spreadsheet runs: `cos report cost --format csv` and the console's /api/costs.csv.

A text cell (a model name, a tag, a profile: text we did not write) beginning with `=`, `+`, `-`, `@`, a tab or a
carriage return is read by a spreadsheet as a formula (`=HYPERLINK(...)`), so it gets a leading `'` (OWASP's CSV
injection advice). Numbers are written as numbers: a negative cost stays `-1.5`, never `'-1.5`. Lines end with
CRLF (RFC 4180), so a cell holding a CR or LF is quoted instead of starting a row of its own.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Final

from commonos.accounting.cost_queries import CostRow

__all__ = ["COST_COLUMNS", "FORMULA_STARTS", "cost_csv", "csv_table", "safe_cell"]

#: A spreadsheet reads a text cell beginning with one of these as a formula.
FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")

Cell = str | int | Decimal | None


def safe_cell(value: Cell) -> str | int | Decimal:
    """`value` as a CSV cell no spreadsheet runs: text beginning with one of `FORMULA_STARTS` gets a leading quote;
    a number is left a number; None is an empty cell."""
    if value is None:
        return ""
    if isinstance(value, str):
        return "'" + value if value.startswith(FORMULA_STARTS) else value
    return value


def csv_table(header: Sequence[str], rows: Iterable[Sequence[Cell]]) -> str:
    """`header` and `rows` as CSV (CRLF line ends, every cell through `safe_cell`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow([safe_cell(cell) for cell in header])
    writer.writerows([safe_cell(cell) for cell in row] for row in rows)
    return out.getvalue()


#: The columns of a cost table after its group's: `cos report cost --format csv` and the console's export alike.
COST_COLUMNS: Final = ("usd", "calls", "unpriced", "input", "output", "reasoning", "cache_read", "cache_write")


def cost_csv(group_by: str, rows: Iterable[tuple[str, CostRow]]) -> str:
    """A cost table as CSV: a header (`group_by`, then `COST_COLUMNS`) and a line per (label, sums)."""
    return csv_table(
        (group_by, *COST_COLUMNS),
        (
            (
                label,
                row.usd,
                row.calls,
                row.unpriced_calls,
                row.input_tokens,
                row.output_tokens,
                row.reasoning_tokens,
                row.cache_read_tokens,
                row.cache_write_tokens,
            )
            for label, row in rows
        ),
    )
