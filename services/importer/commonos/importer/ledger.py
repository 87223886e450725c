"""Every model call of an import counted once, with its most complete usage, whatever files repeat it.

A vendor writes one API response into several files: a resumed or forked session copies its history
into a new file, Claude Code's side transcripts (an aside question) repeat responses of their session,
a subagent's responses appear in its parent's progress lines and in its own file. No link between the
files is needed for the rule to hold; the vendor's identity of the response is enough:

* a call's **key** is the vendor's id of the response (Claude's ``message.id``) where the transcript has
  one, else the invocation's own id (which the adapters mint from vendor identity);
* the **usage** kept for a key is the most complete of its copies (most output tokens, then most tokens
  in all, then one that has a stop reason): a copy holding only the first streaming chunks of a
  response never wins over the finished one, whichever file is read first;
* the **owner** of a key is the first tree of the import that holds it (file order): the call is
  counted in that tree's summary and billed from it, and every other copy is left out of both. A tree
  re-read (the same session) is still its owner.

Usage that is not a model call (what a subagent's Task result states about its own calls) is kept
apart: it is reported as "subagent usage without a transcript" unless the subagent's transcript is
in the import, and never added to the model calls.

An import therefore reads in two passes when it publishes: the first reads every file into a
`Ledger` (`TreeCalls` per tree, small), the second builds each tree's events with the ledger's
verdicts (`Ledger.settle`). A dry run needs only the first.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from commonos.importer.events import call_time
from commonos.importer.model import ImportedSession
from commonos.proto.graph import Graph, ModelInvocation
from commonos.proto.graph.model import USAGE_FIELDS

#: Vendor id kinds that name one API response, across every file it is copied into.
RESPONSE_ID_KINDS = frozenset({"message_id", "response_id"})


class CallCopy(msgspec.Struct, frozen=True, array_like=True):
    """One copy of a model call in one tree."""

    key: str
    invocation: ModelInvocation
    at: datetime


class ReportedUsage(msgspec.Struct, kw_only=True):
    """Tokens a subagent's result states for its own calls, with no transcript of them in the import."""

    reports: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    total_tokens: int = 0

    def add(self, other: ReportedUsage) -> None:
        for name in ReportedUsage.__struct_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Report(msgspec.Struct, frozen=True, array_like=True):
    """One subagent's stated usage, and the subagent's id (None when the result does not say it)."""

    agent_id: str | None
    usage: ReportedUsage


class TreeCalls(msgspec.Struct, kw_only=True):
    """What the ledger needs of one tree: its calls, its subagents' stated usage, the subagents it holds."""

    session_id: str
    calls: list[CallCopy] = msgspec.field(default_factory=list)
    reports: list[Report] = msgspec.field(default_factory=list)
    agent_ids: list[str] = msgspec.field(default_factory=list)


def completeness(invocation: ModelInvocation) -> tuple[int, int, bool]:
    return invocation.output_tokens, invocation.total_tokens, invocation.stop_reason is not None


def call_keys(graph: Graph) -> dict[str, str]:
    """Each invocation's key: the vendor's response id where the graph maps one, else its own id."""
    by_vendor: dict[str, str] = {}
    for row in graph.vendor_ids:
        if row.our_type == "model_invocation" and row.vendor_id_kind in RESPONSE_ID_KINDS:
            by_vendor.setdefault(row.our_id, f"{row.vendor}:{row.vendor_id_kind}:{row.vendor_id}")
    return {m.id: by_vendor.get(m.id, m.id) for m in graph.model_invocations}


def tree_calls(imported: ImportedSession) -> TreeCalls:
    graph = imported.graph
    root = graph.root()
    keys = call_keys(graph)
    reports = []
    agent_of_usage = {
        v.our_id: v.vendor_id
        for v in graph.vendor_ids
        if v.our_type == "token_usage" and v.vendor_id_kind == "agent_id"
    }
    for row in graph.token_usage:
        parts = [row.input_tokens or 0, row.output_tokens or 0, row.cache_read_tokens or 0, row.cache_write_tokens or 0]
        usage = ReportedUsage(
            reports=1,
            input_tokens=parts[0],
            output_tokens=parts[1],
            cache_read_tokens=parts[2],
            cache_write_tokens=parts[3],
            total_tokens=sum(parts),
        )
        reports.append(Report(agent_of_usage.get(row.id), usage))
    return TreeCalls(
        session_id=root.id if root is not None else "",
        calls=[CallCopy(keys[m.id], m, call_time(graph, m)) for m in graph.model_invocations],
        reports=reports,
        agent_ids=[v.vendor_id for v in graph.vendor_ids if v.our_type == "session" and v.vendor_id_kind == "agent_id"],
    )


class Ledger:
    """The calls of a whole import: the most complete copy and the owning tree of every call."""

    def __init__(self) -> None:
        self.best: dict[str, ModelInvocation] = {}
        self.owner: dict[str, str] = {}
        self.agents: set[str] = set()

    def add(self, tree: TreeCalls) -> None:
        for copy in tree.calls:
            self.owner.setdefault(copy.key, tree.session_id)
            known = self.best.get(copy.key)
            if known is None or completeness(copy.invocation) > completeness(known):
                self.best[copy.key] = copy.invocation
        self.agents.update(tree.agent_ids)

    def owned(self, tree: TreeCalls) -> list[tuple[ModelInvocation, datetime]]:
        """The calls `tree` counts (each once), each with its most complete usage."""
        out = []
        seen: set[str] = set()
        for copy in tree.calls:
            if self.owner.get(copy.key, tree.session_id) != tree.session_id or copy.key in seen:
                continue
            seen.add(copy.key)
            out.append((self.completed(copy.key, copy.invocation), copy.at))
        return out

    def unlinked_reports(self, tree: TreeCalls) -> ReportedUsage:
        """The usage `tree`'s subagent results state for subagents whose transcript the import lacks."""
        total = ReportedUsage()
        for report in tree.reports:
            if report.agent_id is None or report.agent_id not in self.agents:
                total.add(report.usage)
        return total

    def completed(self, key: str, invocation: ModelInvocation) -> ModelInvocation:
        """`invocation` with the usage of its key's most complete copy."""
        best = self.best.get(key)
        if best is None or best is invocation or completeness(best) <= completeness(invocation):
            return invocation
        return msgspec.structs.replace(invocation, **{name: getattr(best, name) for name in USAGE_FIELDS})

    def settle(self, imported: ImportedSession) -> tuple[ImportedSession, set[str]]:
        """`imported` with every call's most complete usage, and the invocations another tree bills."""
        graph = imported.graph
        root = graph.root()
        session_id = root.id if root is not None else ""
        keys = call_keys(graph)
        billed_elsewhere: set[str] = set()
        seen: set[str] = set()
        for invocation in graph.model_invocations:
            key = keys[invocation.id]
            if self.owner.get(key, session_id) != session_id or key in seen:
                billed_elsewhere.add(invocation.id)
            seen.add(key)
        invocations = [self.completed(keys[m.id], m) for m in graph.model_invocations]
        if all(new is old for new, old in zip(invocations, graph.model_invocations, strict=True)):
            return imported, billed_elsewhere
        settled = msgspec.structs.replace(graph, model_invocations=invocations)
        return msgspec.structs.replace(imported, graph=settled), billed_elsewhere
