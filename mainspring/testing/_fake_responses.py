"""OpenAI's Responses API wire shapes for :class:`~mainspring.testing.FakeOpenAIServer`
(``POST /v1/responses``), the API the OpenAI Agents SDK's default model speaks.

A scripted reply (text and/or tool calls) renders as a ``response`` object whose
``output`` holds a ``message`` item (``output_text`` content) and one
``function_call`` item per call; streamed (``"stream": true``) it is the real event
sequence: ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` … ``response.output_item.done`` (text as
``response.output_text.delta`` pieces, arguments as
``response.function_call_arguments.delta`` pieces), then ``response.completed``
carrying the whole response. Every event has its ``sequence_number``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from ..models import Usage
from ._fake_common import FakeReply, call_id

__all__ = ["render_response", "response_events"]


def render_response(
    reply: FakeReply, body: Mapping[str, Any], usage: Usage, n: int
) -> dict[str, Any]:
    """The body of a non-streamed ``/v1/responses`` reply."""
    output: list[dict[str, Any]] = []
    text = reply.text if reply.text is not None else None
    if text or reply.refusal:
        content: list[dict[str, Any]] = []
        if text:
            content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
        if reply.refusal:
            content.append({"type": "refusal", "refusal": reply.refusal})
        output.append(
            {
                "type": "message",
                "id": f"msg_fake{n}",
                "status": "completed",
                "role": "assistant",
                "content": content,
            }
        )
    for i, call in enumerate(reply.tool_calls):
        arguments = (
            call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        )
        output.append(
            {
                "type": "function_call",
                "id": f"fc_fake{n}_{i}",
                "call_id": call_id(call, n, i),
                "name": call.name,
                "arguments": arguments,
                "status": "completed",
            }
        )
    return {
        "id": f"resp_fake{n}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": str(body.get("model") or "fake"),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": bool(body.get("store", True)),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
        "user": None,
        "metadata": {},
    }


def response_events(body: Mapping[str, Any], pieces: Any) -> list[tuple[str | None, str]]:
    """A rendered response as the Responses API's streamed events."""
    out: list[tuple[str | None, str]] = []

    def emit(kind: str, **fields: Any) -> None:
        out.append((kind, json.dumps({"type": kind, "sequence_number": len(out), **fields})))

    start = {**body, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for c_index, part in enumerate(item["content"]):
                # Every event of a part says where it is: its item, the item's place, its own.
                at = {"item_id": item["id"], "output_index": index, "content_index": c_index}
                empty = {**part, "text": ""} if part["type"] == "output_text" else part
                emit("response.content_part.added", **at, part=empty)
                if part["type"] == "output_text":
                    for piece in pieces(part["text"]):
                        emit("response.output_text.delta", **at, delta=piece, logprobs=[])
                    emit("response.output_text.done", **at, text=part["text"], logprobs=[])
                emit("response.content_part.done", **at, part=part)
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            at = {"item_id": item["id"], "output_index": index}
            for piece in pieces(item["arguments"]):
                emit("response.function_call_arguments.delta", **at, delta=piece)
            emit(
                "response.function_call_arguments.done",
                **at,
                name=item["name"],
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=body)
    return out
