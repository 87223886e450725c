"""The TypeScript types gen-types.mjs writes from proto/schema let a subscriber read what the contract promises:
tool `args` is any JSON object, so `e.args.command` compiles (as `unknown`, to be narrowed)."""

from __future__ import annotations

import json

from tests.deploy.node_examples import NodeExamples, _run
from tests.deploy.test_subscriber_example import node_examples

SNIPPET = """\
import type { CosEvent } from "./events.js";

export function command(e: CosEvent): string | null {
  if (e.type !== "tool_call_recorded") return null;
  const value: unknown = e.args.command;
  const keys: string[] = Object.keys(e.args);
  return typeof value === "string" ? value : keys.join(",");
}
"""


def test_tool_args_are_a_json_object_in_the_generated_types(node_examples: NodeExamples) -> None:
    folder = node_examples.folder
    (folder / "args-snippet.ts").write_text(SNIPPET)
    config = {"extends": "./tsconfig.json", "files": ["args-snippet.ts"]}
    (folder / "tsconfig.args.json").write_text(json.dumps(config))
    tsc = str(folder / "node_modules" / ".bin" / "tsc")
    _run([tsc, "-p", "tsconfig.args.json"], folder, node_examples.env, "tsc of a snippet reading e.args.command")
    declared = (folder / "events.d.ts").read_text()
    assert "[k: string]: unknown" in declared


__all__ = ["node_examples"]  # the fixture, shared with test_subscriber_example
