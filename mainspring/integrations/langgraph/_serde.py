"""Values a graph passes around (node updates, inputs, interrupt payloads, state),
as the journal's JSON.

Readable where it can be: JSON data stays itself, LangChain messages take LangChain's
own dict form (``message_to_dict``), ``Send`` and ``Command`` a small form of their
own. Anything else (tuples, pydantic models, dataclasses, datetimes) goes through
LangGraph's checkpoint serializer, the one its savers use, as base64 text: whatever a
checkpoint can hold, the journal can.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command, Send

__all__ = ["decode", "decode_typed", "encode", "encode_typed"]

_SERDE = JsonPlusSerializer()
_LC, _LG, _SEND, _COMMAND = "__lc__", "__lg__", "__send__", "__command__"
_MARKERS = frozenset({_LC, _LG, _SEND, _COMMAND})


def encode_typed(value: Any) -> str:
    """One value as ``"type:base64"`` through LangGraph's serializer."""
    kind, data = _SERDE.dumps_typed(value)
    return f"{kind}:{base64.b64encode(data).decode('ascii')}"


def decode_typed(text: str) -> Any:
    kind, _, data = text.partition(":")
    return _SERDE.loads_typed((kind, base64.b64decode(data)))


def encode(value: Any) -> Any:
    """``value`` as JSON data that :func:`decode` turns back into an equal value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_LG: encode_typed(value)}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (
            len(value) == 1 and set(value) & _MARKERS
        ):
            return {k: encode(v) for k, v in value.items()}
        return {_LG: encode_typed(value)}
    if isinstance(value, Send):
        return {_SEND: {"node": value.node, "arg": encode(value.arg)}}
    if isinstance(value, Command):
        goto = value.goto
        return {
            _COMMAND: {
                "graph": value.graph,
                "update": encode(value.update),
                "resume": encode(value.resume),
                "goto": encode(list(goto) if isinstance(goto, tuple | list) else goto),
            }
        }
    if isinstance(value, BaseMessage):
        return {_LC: message_to_dict(value)}
    return {_LG: encode_typed(value)}


def decode(data: Any) -> Any:
    """The value :func:`encode` made ``data`` from."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        ((key, inner),) = data.items()
        if key == _LC:
            return messages_from_dict([inner])[0]
        if key == _LG:
            return decode_typed(inner)
        if key == _SEND:
            return Send(inner["node"], decode(inner["arg"]))
        if key == _COMMAND:
            goto = decode(inner["goto"])
            return Command(
                graph=inner["graph"],
                update=decode(inner["update"]),
                resume=decode(inner["resume"]),
                goto=tuple(goto) if isinstance(goto, list) else goto,
            )
    return {k: decode(v) for k, v in data.items()}
