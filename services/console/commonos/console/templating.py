"""Jinja2 templates (autoescape on for every template: messages and tool output are attacker-controlled).

A page renders with `render(request, "sessions.html", {...})`: the context gets `who` (the Principal or None),
`csrf_token`, `nav` and `static` (the URL of a static file, with the console's version to bust caches).
Messages, arguments and results go through the filters of `commonos.console.content` (`markdown`, `json_view`,
`result_view`, `plain_folded`, `agent_text`): sanitized Markdown, folding JSON, long text folded.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from fastapi import Request
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.responses import HTMLResponse

from commonos.console import content
from commonos.console.auth import optional_principal
from commonos.runtime.http import VERSION

HERE: Final = Path(__file__).parent
TEMPLATES_DIR: Final = HERE / "templates"
STATIC_DIR: Final = HERE / "static"

#: The navigation bar: (path, label, operators only). A page module adds itself here by its path.
NAV: Final = [
    ("/sessions", "Sessions", False),
    ("/chat", "Chat", False),
    ("/approvals", "Approvals", False),
    ("/costs", "Costs", False),
    ("/imported", "Imported", False),
    ("/operations", "Operations", True),
]


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _usd(value: Decimal | float | None) -> str:
    if value is None:
        return "—"
    return f"${Decimal(value):,.6f}".rstrip("0").rstrip(".") if value else "$0"


def make_environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["usd"] = _usd
    env.filters["pretty_json"] = content.pretty_json
    # Attacker-controlled text made readable and inert (commonos.console.content).
    env.filters["markdown"] = content.markdown_folded
    env.filters["json_view"] = content.json_view
    env.filters["result_view"] = content.result_view
    env.filters["plain_folded"] = content.plain_folded
    env.filters["agent_text"] = content.agent_text
    env.globals["version"] = VERSION
    env.globals["static"] = lambda path: f"/static/{path}?v={VERSION}"
    return env


ENV: Final = make_environment()


def render(
    request: Request,
    template: str,
    context: Mapping[str, Any] | None = None,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    who = optional_principal(request)
    full = {
        "request": request,
        "who": who,
        "csrf_token": who.csrf_token if who is not None else "",
        "nav": [(p, label) for p, label, ops in NAV if who is not None and (not ops or who.user.is_operator)],
        "path": request.url.path,
        **(context or {}),
    }
    html = ENV.get_template(template).render(full)
    return HTMLResponse(html, status_code=status_code, headers=headers)
