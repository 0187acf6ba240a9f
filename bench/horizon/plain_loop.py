"""The plain loop: the official ``openai`` SDK's function calling, no framework.

The loop the OpenAI function-calling guide shows: send the messages and the tools,
append the assistant's reply, run each tool call, append its result as a ``tool``
message under the call's ``tool_call_id``, repeat until the model calls ``finish``.

- **Retries**: the SDK's own, at its defaults: ``max_retries=2`` (three attempts) on
  connection errors, timeouts, 408, 409, 429 and 5xx, with exponential back-off from
  0.5 s (capped at 8 s, jittered) that honours ``retry-after``/``retry-after-ms``.
  A call that still fails ends the run (exit 1): the loop has no retry of its own.
- **Timeout**: the client's ``timeout`` is the suite server's ``client_timeout_s``.
- **Arguments** that are not a JSON object go back to the model as the tool result
  ``{"error": ...}``; the world checks the rest.
- **Idempotency key**: the tool call's id, what the loop has.
- **Crashes**: nothing is durable. A restarted process starts the task again from its
  first message; the world keeps what was done, so the model finds its way from the
  world's answers (and pays again for what it had already seen).
- **Approvals**: the loop asks the reviewer (``SuiteFaults.request_approval``, keyed
  by the tool call id) and polls until it answers; a rejected call's result says so.

Kill points: ``"model"`` after each reply; no ``"commit"`` (nothing is written).

    python bench/horizon/plain_loop.py --task support --label b1 --world w.db \\
        --state dir --max-steps 40
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from _common import MODEL, RunnerArgs, Tools, client_timeout_s, dumps, openai_tools, parse_args
from openai import OpenAI


def run(args: RunnerArgs) -> int:
    """The loop; 0 when the model called ``finish``, 1 when it gave up."""
    tools = Tools(args)
    client = OpenAI(
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        timeout=client_timeout_s(),
    )
    messages: list[Any] = [
        {"role": "system", "content": args.spec.instructions},
        {"role": "user", "content": args.task_text},
    ]
    schemas = openai_tools(args.spec)
    for _ in range(args.max_steps):
        completion = client.chat.completions.create(model=MODEL, messages=messages, tools=schemas)
        tools.kill_point("model")
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(f"{args.label}: the model answered without a tool call", file=sys.stderr)
            return 1
        for call in message.tool_calls:
            if call.type != "function":
                continue
            name, raw = call.function.name, call.function.arguments
            if name == "finish":
                return 0
            result = _run_call(tools, name, raw, call.id)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": dumps(result)})
    print(f"{args.label}: gave up after {args.max_steps} model calls", file=sys.stderr)
    return 1


def _run_call(tools: Tools, name: str, raw: str, call_id: str) -> dict[str, Any]:
    try:
        arguments = json.loads(raw)
    except ValueError as e:
        return {"ok": False, "error": f"arguments are not valid JSON: {e}"}
    if not isinstance(arguments, dict):
        return {"ok": False, "error": f"arguments must be a JSON object, got {raw!r}"}
    if tools.needs_approval(name) and not tools.wait_for_approval(call_id, name, raw):
        return {"ok": False, "error": f"the reviewer rejected {name} {raw}"}
    return tools.call(name, arguments, call_id)


if __name__ == "__main__":
    sys.exit(run(parse_args(description=__doc__)))
