"""Pure summaries of session graphs: tokens by kind per session and per model, tool calls, files.

Token kinds follow the graph's convention (input excludes cache reads and writes). Usage rows
that could not be attributed to one invocation (TokenUsage) are counted under their model, or
``None`` when the vendor did not say, so nothing reported is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from commonos.proto.graph import Graph


class ModelTokens(msgspec.Struct, kw_only=True):
    """Tokens one model consumed, by kind; ``invocations`` counts model replies."""

    model: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    total_tokens: int = 0
    invocations: int = 0


class SessionSummary(msgspec.Struct, kw_only=True):
    session_id: str
    parent_session_id: str | None
    title: str | None
    outcome: str
    models: list[ModelTokens]
    tool_calls: dict[str, int]
    files_touched: list[str]


class GraphSummary(msgspec.Struct, kw_only=True):
    root_session_id: str | None
    models: list[ModelTokens]
    sessions: list[SessionSummary]


def _add(into: dict[str | None, ModelTokens], model: str | None, counts: Iterable[int | None], calls: int) -> None:
    entry = into.setdefault(model, ModelTokens(model=model))
    input_tokens, output_tokens, cache_read, cache_write = (c or 0 for c in counts)
    entry.input_tokens += input_tokens
    entry.output_tokens += output_tokens
    entry.cache_read_tokens += cache_read
    entry.cache_write_tokens += cache_write
    entry.total_tokens += input_tokens + output_tokens + cache_read + cache_write
    entry.invocations += calls


def summarize(graph: Graph) -> GraphSummary:
    """Summarize one graph per session and per model."""
    per_session: dict[str, dict[str | None, ModelTokens]] = {s.id: {} for s in graph.sessions}
    overall: dict[str | None, ModelTokens] = {}
    for m in graph.model_invocations:
        counts = (m.input_tokens, m.output_tokens, m.cache_read_tokens, m.cache_write_tokens)
        _add(per_session.setdefault(m.session_id, {}), m.model, counts, 1)
        _add(overall, m.model, counts, 1)
    for u in graph.token_usage:
        counts_u = (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens)
        _add(per_session.setdefault(u.session_id, {}), u.model, counts_u, u.api_call_count or 0)
        _add(overall, u.model, counts_u, u.api_call_count or 0)
    sessions = []
    for s in graph.sessions:
        tool_calls: dict[str, int] = {}
        for t in graph.tool_uses:
            if t.session_id == s.id:
                tool_calls[str(t.verb)] = tool_calls.get(str(t.verb), 0) + 1
        files = sorted({f.path for f in graph.file_touches if f.session_id == s.id})
        sessions.append(
            SessionSummary(
                session_id=s.id,
                parent_session_id=s.parent_session_id,
                title=s.title,
                outcome=str(s.outcome),
                models=list(per_session.get(s.id, {}).values()),
                tool_calls=tool_calls,
                files_touched=files,
            )
        )
    root = graph.root()
    return GraphSummary(
        root_session_id=root.id if root is not None else None,
        models=list(overall.values()),
        sessions=sessions,
    )


def summary_json(graph: Graph) -> bytes:
    """The summary of ``graph`` as JSON; per-model records carry ``model`` and tokens by kind."""
    return msgspec.json.encode(summarize(graph))
