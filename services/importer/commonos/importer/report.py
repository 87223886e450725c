"""What an import found, per session tree and per model: tokens by kind, cost, tool calls, files.

Pure: costs come from billing's offline :class:`~commonos.accounting.pricing.Pricer` (genai-prices), with the
provider, model, tokens and time the ``model_call_completed`` events carry, so the summary's cost is
what billing will charge for the same calls. Each call is counted once, with its most complete usage,
in the first tree that holds it (`commonos.importer.ledger`). Usage a subagent's result states about
its own calls is no model call: it is shown apart ("subagent usage without a transcript"), and not at
all when the subagent's transcript is in the import.

A tree that an import could not publish (whatever the reason) is listed as not imported, with the
reason, and left out of the per-model lines and the totals: they count what was stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from commonos.accounting.usage import TokenUsage as BilledUsage
from commonos.importer.events import has_usage
from commonos.importer.ledger import Ledger, ReportedUsage, TreeCalls, tree_calls
from commonos.importer.model import ImportedSession
from commonos.importer.publish import PublishCounts
from commonos.importer.vendors import provider_of
from commonos.proto.graph import ModelInvocation

if TYPE_CHECKING:  # genai-prices takes a tenth of a second to import: not in reader processes
    from commonos.accounting.pricing import Pricer

UNKNOWN_MODEL = "unknown"


class TokenCounts(msgspec.Struct, kw_only=True):
    """Tokens by kind (input excludes cache reads and writes), model calls and their cost in USD."""

    invocations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: The part of `output_tokens` that was reasoning, where the vendor says.
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    total_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    unpriced_invocations: int = 0

    def add(self, other: TokenCounts) -> None:
        for name in TokenCounts.__struct_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class ModelSummary(TokenCounts, kw_only=True):
    model: str


class SessionSummary(TokenCounts, kw_only=True):
    """One imported tree: a top-level session with every nested (subagent) session rolled in."""

    session_id: str
    vendor_session_id: str | None
    vendor: str
    project: str | None
    branch: str | None
    title: str | None
    source_path: str
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str
    nested_sessions: int
    tool_calls: dict[str, int]
    files_touched: int
    models: list[ModelSummary]
    #: True once every event of the tree is published; False when publishing it failed (see
    #: `not_imported`), and then its tokens and cost are not in the totals; None in a dry run.
    imported: bool | None = None
    #: Why the tree was not imported.
    not_imported: str | None = None
    #: Rows whose large text was cut so that they fit a message (see `commonos.importer.cut`).
    rows_cut: int = 0
    #: What the tree's subagent results state about subagents whose transcript the import does not hold;
    #: not model calls, so in neither `models` nor the totals.
    subagent_usage_without_transcript: ReportedUsage = msgspec.field(default_factory=ReportedUsage)
    #: The tree's cost by the vendor's own reckoning, where its transcript states one (Claude Code's
    #: ``cost-state`` lines), and ours minus it.
    vendor_cost_usd: Decimal | None = None
    cost_difference_usd: Decimal | None = None
    #: Tokens the vendor's own totals count beyond every call the transcript writes (the calls it writes no
    #: line for, such as Claude Code's /compact summary call); None when the transcript states no totals.
    #: Not model calls of the import: neither billed nor in the totals.
    usage_without_transcript_line: ReportedUsage | None = None


class VendorCost(msgspec.Struct, kw_only=True):
    """Over the sessions whose transcript states the vendor's own cost: theirs, ours, and ours minus theirs."""

    sessions: int = 0
    vendor_cost_usd: Decimal = Decimal(0)
    cost_usd: Decimal = Decimal(0)
    difference_usd: Decimal = Decimal(0)


class ImportSummary(msgspec.Struct, kw_only=True):
    vendor: str
    root: str
    dry_run: bool
    sessions: list[SessionSummary]
    #: Per model and in all, over the trees imported (every tree in a dry run).
    models: list[ModelSummary]
    totals: TokenCounts
    published: PublishCounts | None = None
    errors: list[str] = msgspec.field(default_factory=list)
    #: Input skipped without failing the import: files that are not regular files, lines over the cap.
    warnings: list[str] = msgspec.field(default_factory=list)
    #: Trees not imported, left out of `models` and `totals`.
    sessions_not_imported: int = 0
    rows_cut: int = 0
    #: Over the trees imported: see `SessionSummary.subagent_usage_without_transcript`.
    subagent_usage_without_transcript: ReportedUsage = msgspec.field(default_factory=ReportedUsage)
    #: Over the trees imported whose transcript states the vendor's cost (None: none does).
    vendor_cost: VendorCost | None = None
    #: Over the trees imported: see `SessionSummary.usage_without_transcript_line`.
    usage_without_transcript_line: ReportedUsage = msgspec.field(default_factory=ReportedUsage)


def invocation_counts(pricer: Pricer, vendor: str, invocation: ModelInvocation, at: datetime) -> TokenCounts:
    """One invocation's tokens and the cost billing will compute for it (`at`: the call's time)."""
    from commonos.accounting.pricing import CostStatus

    one_hour = invocation.cache_write_1h_tokens or 0
    counts = TokenCounts(
        invocations=1,
        input_tokens=invocation.input_tokens,
        output_tokens=invocation.output_tokens,
        reasoning_tokens=invocation.reasoning_tokens or 0,
        cache_read_tokens=invocation.cache_read_tokens,
        cache_write_tokens=invocation.cache_write_tokens,
        cache_write_1h_tokens=one_hour,
        total_tokens=invocation.input_tokens
        + invocation.output_tokens
        + invocation.cache_read_tokens
        + invocation.cache_write_tokens,
    )
    if not has_usage(invocation):
        return counts
    usage = BilledUsage(
        input_tokens=invocation.input_tokens,
        output_tokens=invocation.output_tokens,
        cache_read_tokens=invocation.cache_read_tokens,
        cache_write_5m_tokens=invocation.cache_write_tokens - one_hour,
        cache_write_1h_tokens=one_hour,
        speed=invocation.speed,
    )
    provider = provider_of(vendor)
    price = pricer.price(provider, invocation.model or UNKNOWN_MODEL, usage, at)
    if price.cost_usd is None or price.status == CostStatus.UNPRICED:
        counts.unpriced_invocations = 1
    else:
        counts.cost_usd = price.cost_usd
    return counts


def _models(by_model: dict[str, TokenCounts]) -> list[ModelSummary]:
    out = []
    for model in sorted(by_model):
        line = ModelSummary(model=model)
        line.add(by_model[model])
        out.append(line)
    return out


def summarize_tree(pricer: Pricer, imported: ImportedSession, ledger: Ledger | None = None) -> SessionSummary:
    """The summary of one imported tree, its calls counted as `ledger` says (None: the tree alone)."""
    summary = describe_tree(imported)
    calls = tree_calls(imported)
    if ledger is None:
        ledger = Ledger()
        ledger.add(calls)
    account(summary, calls, ledger, pricer)
    return summary


def describe_tree(imported: ImportedSession) -> SessionSummary:
    """One tree's summary without its accounting (see `account`)."""
    graph = imported.graph
    root = graph.root()
    tool_calls: dict[str, int] = {}
    for tool_use in graph.tool_uses:
        tool_calls[str(tool_use.verb)] = tool_calls.get(str(tool_use.verb), 0) + 1
    vendor_session = next(
        (v.vendor_id for v in graph.vendor_ids if root is not None and v.our_id == root.id and v.our_type == "session"),
        None,
    )
    return SessionSummary(
        session_id=root.id if root is not None else "",
        vendor_session_id=vendor_session,
        vendor=imported.vendor,
        project=imported.project,
        branch=imported.branch,
        title=root.title if root is not None else None,
        source_path=str(imported.source_path),
        started_at=root.started_at if root is not None else None,
        ended_at=root.ended_at if root is not None else None,
        outcome=str(root.outcome) if root is not None else "unknown",
        nested_sessions=max(0, len(graph.sessions) - 1),
        tool_calls=dict(sorted(tool_calls.items())),
        files_touched=len({f.path for f in graph.file_touches}),
        models=[],
        vendor_cost_usd=imported.vendor_cost_usd,
        usage_without_transcript_line=_beyond(imported),
    )


def _beyond(imported: ImportedSession) -> ReportedUsage | None:
    """What the vendor's own totals count beyond the tree's calls (each call once), kind by kind."""
    if imported.vendor_tokens is None:
        return None
    ours = dict.fromkeys(imported.vendor_tokens, 0)
    seen: set[str] = set()
    for copy in tree_calls(imported).calls:
        if copy.key not in seen:
            seen.add(copy.key)
            for kind in ours:
                ours[kind] += getattr(copy.invocation, kind)
    extra = {kind: max(0, imported.vendor_tokens[kind] - ours[kind]) for kind in ours}
    if not any(extra.values()):
        return ReportedUsage()
    return ReportedUsage(reports=1, total_tokens=sum(extra.values()), **extra)


def account(summary: SessionSummary, calls: TreeCalls, ledger: Ledger, pricer: Pricer) -> None:
    """Fill `summary`'s tokens and cost: the calls `ledger` counts in this tree, priced as billing will."""
    by_model: dict[str, TokenCounts] = {}
    for invocation, at in ledger.owned(calls):
        counts = invocation_counts(pricer, summary.vendor, invocation, at)
        by_model.setdefault(invocation.model or UNKNOWN_MODEL, TokenCounts()).add(counts)
    summary.models = _models(by_model)
    for name in TokenCounts.__struct_fields__:
        setattr(summary, name, getattr(TokenCounts(), name))
    for line in summary.models:
        summary.add(_only_counts(line))
    summary.subagent_usage_without_transcript = ledger.unlinked_reports(calls)
    if summary.vendor_cost_usd is not None:
        summary.cost_difference_usd = summary.cost_usd - summary.vendor_cost_usd


def _only_counts(line: TokenCounts) -> TokenCounts:
    counts = TokenCounts()
    counts.add(line)
    return counts


def summarize_import(
    vendor: str,
    root: Path,
    trees: Iterable[SessionSummary],
    *,
    dry_run: bool,
    published: PublishCounts | None = None,
    errors: Sequence[str] = (),
    warnings: Sequence[str] = (),
) -> ImportSummary:
    """The summary of a whole import from its trees' summaries: per tree, per model across trees, and totals.

    A tree not imported is listed but not counted in the per-model lines and the totals.
    """
    sessions = sorted(
        trees, key=lambda s: (s.started_at is None, s.started_at.timestamp() if s.started_at else 0.0, s.session_id)
    )
    by_model: dict[str, TokenCounts] = {}
    totals = TokenCounts()
    apart = ReportedUsage()
    unlogged = ReportedUsage()
    vendor_cost: VendorCost | None = None
    for session in sessions:
        if session.imported is False:
            continue
        apart.add(session.subagent_usage_without_transcript)
        if session.usage_without_transcript_line is not None:
            unlogged.add(session.usage_without_transcript_line)
        if session.vendor_cost_usd is not None:
            vendor_cost = vendor_cost or VendorCost()
            vendor_cost.sessions += 1
            vendor_cost.vendor_cost_usd += session.vendor_cost_usd
            vendor_cost.cost_usd += session.cost_usd
            vendor_cost.difference_usd += session.cost_usd - session.vendor_cost_usd
        for line in session.models:
            by_model.setdefault(line.model, TokenCounts()).add(_only_counts(line))
            totals.add(_only_counts(line))
    return ImportSummary(
        vendor=vendor,
        root=str(root),
        dry_run=dry_run,
        sessions=sessions,
        models=_models(by_model),
        totals=totals,
        published=published,
        errors=list(errors),
        warnings=list(warnings),
        sessions_not_imported=sum(1 for s in sessions if s.imported is False),
        rows_cut=sum(s.rows_cut for s in sessions),
        subagent_usage_without_transcript=apart,
        vendor_cost=vendor_cost,
        usage_without_transcript_line=unlogged,
    )


_json_encoder = msgspec.json.Encoder(decimal_format="number")


def summary_json(summary: ImportSummary) -> bytes:
    """The summary as JSON: per-session and per-model records carry ``model`` and tokens by kind; cost is a number."""
    return _json_encoder.encode(summary)
