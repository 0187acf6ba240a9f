"""What opt-in content capture puts on spans, in the two conventions tracing backends
read: OpenInference (Arize Phoenix; ``input.value``, ``llm.input_messages.<i>.message.*``)
and the OpenTelemetry GenAI conventions (Langfuse and others; ``gen_ai.input.messages``,
``gen_ai.output.messages``, ``gen_ai.system_instructions``, ``gen_ai.tool.call.*``).

Every text is redacted by the App's redactor and capped (``max_chars``) before it is
put on a span; a model call keeps its system prompt and its last ``MAX_MESSAGES``
other messages, so that a 200-turn conversation does not make every span carry the
whole history. Pure functions of their arguments: no OpenTelemetry import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import (
    AssistantMessage,
    Message,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from ._jsontext import json_or_text

__all__ = ["MAX_MESSAGES", "Capture"]

#: Non-system messages of a model call put on its span (the most recent ones).
MAX_MESSAGES = 20

_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Capture:
    """Turns what a step took and returned into span attributes."""

    redact: Callable[[str], str] | None
    max_chars: int = 2000

    def text(self, text: str | None) -> str | None:
        """``text`` redacted and capped; ``None`` when empty."""
        if not text:
            return None
        if self.redact is not None:
            text = self.redact(text)
        cap = self.max_chars
        return text if len(text) <= cap else text[: cap - 1] + "…"

    def io(self, given: str | None, returned: str | None, *, kind: str) -> dict[str, Any]:
        """A step's or tool's input and output (JSON or text, as journaled)."""
        attrs: dict[str, Any] = {}
        given, returned = self.text(given), self.text(returned)
        if given:
            attrs["input.value"] = given
            attrs["input.mime_type"] = _mime(given)
            if kind == "tool":
                attrs["gen_ai.tool.call.arguments"] = given
        if returned:
            attrs["output.value"] = returned
            attrs["output.mime_type"] = _mime(returned)
            if kind == "tool":
                attrs["gen_ai.tool.call.result"] = returned
        return attrs

    def run(self, input_json: str | None, output_json: str | None) -> dict[str, Any]:
        """A run's root span: its task (a single text argument as itself) and its
        final answer (an agent's ``answer``), else their JSON."""
        return self.io(_task(input_json), _answer(output_json), kind="run")

    def model(self, messages: Sequence[Message], reply: ModelResponse | None) -> dict[str, Any]:
        """A model call: the messages it sent, and the reply when it returned one."""
        attrs: dict[str, Any] = {}
        system = [m for m in messages if isinstance(m, SystemMessage)]
        others = [m for m in messages if not isinstance(m, SystemMessage)][-MAX_MESSAGES:]
        sent = [*system, *others]
        for i, m in enumerate(sent):
            attrs.update(self._openinference(f"llm.input_messages.{i}.message", m))
        if system:
            parts = [{"type": "text", "content": self.text(m.content) or ""} for m in system]
            attrs["gen_ai.system_instructions"] = _dumps(parts)
        if others:
            attrs["gen_ai.input.messages"] = _dumps([self._genai(m) for m in others])
            attrs["input.value"] = attrs["gen_ai.input.messages"]
            attrs["input.mime_type"] = _JSON
        if reply is not None:
            said = AssistantMessage(text=reply.text, tool_calls=reply.tool_calls)
            attrs.update(self._openinference("llm.output_messages.0.message", said))
            out = {**self._genai(said), "finish_reason": reply.finish_reason}
            attrs["gen_ai.output.messages"] = _dumps([out])
            calls = [f"{c.name}({c.arguments})" for c in reply.tool_calls]
            text = self.text(" ".join(p for p in [reply.text or "", *calls] if p))
            if text:
                attrs["output.value"] = text
                attrs["output.mime_type"] = "text/plain"
        return attrs

    def _openinference(self, prefix: str, m: Message) -> dict[str, Any]:
        role, text, calls = _parts(m)
        attrs: dict[str, Any] = {f"{prefix}.role": role}
        content = self.text(text)
        if content:
            attrs[f"{prefix}.content"] = content
        if isinstance(m, ToolResultMessage):
            attrs[f"{prefix}.tool_call_id"] = m.tool_call_id
            attrs[f"{prefix}.name"] = m.name
        for j, c in enumerate(calls):
            call = f"{prefix}.tool_calls.{j}.tool_call"
            attrs[f"{call}.id"] = c.id
            attrs[f"{call}.function.name"] = c.name
            attrs[f"{call}.function.arguments"] = self.text(c.arguments) or ""
        return attrs

    def _genai(self, m: Message) -> dict[str, Any]:
        role, text, calls = _parts(m)
        parts: list[dict[str, Any]] = []
        if isinstance(m, ToolResultMessage):
            parts.append(
                {"type": "tool_call_response", "id": m.tool_call_id, "response": self.text(text)}
            )
        elif text:
            parts.append({"type": "text", "content": self.text(text)})
        for c in calls:
            parts.append(
                {
                    "type": "tool_call",
                    "id": c.id,
                    "name": c.name,
                    "arguments": _arguments(self.text(c.arguments)),
                }
            )
        return {"role": role, "parts": parts}


def _parts(m: Message) -> tuple[str, str | None, tuple[ToolCall, ...]]:
    if isinstance(m, AssistantMessage):
        return "assistant", m.text, m.tool_calls
    if isinstance(m, ToolResultMessage):
        return "tool", m.content, ()
    if isinstance(m, UserMessage):
        return "user", m.content, ()
    return "system", m.content, ()


def _arguments(text: str | None) -> Any:
    """A call's arguments as the object they are (the GenAI schema), else the text
    (capped JSON no longer parses)."""
    return json_or_text(text) if text else None


def _task(input_json: str | None) -> str | None:
    if not input_json:
        return None
    data = json_or_text(input_json)
    if isinstance(data, dict):
        args, kwargs = data.get("args") or [], data.get("kwargs") or {}
        if len(args) == 1 and not kwargs and isinstance(args[0], str):
            return str(args[0])  # an agent's task, as the person wrote it
    return input_json


def _answer(output_json: str | None) -> str | None:
    if not output_json:
        return None
    data = json_or_text(output_json)  # not JSON: the text, shown as it is
    if isinstance(data, dict) and "answer" in data and "status" in data:
        answer = data["answer"]  # an AgentResult
        if isinstance(answer, str):
            return answer
        return None if answer is None else _dumps(answer)
    if isinstance(data, str):
        return data
    return output_json


def _mime(text: str) -> str:
    # capped JSON ends with "…" and no longer parses: plain text then
    return _JSON if text[:1] in ("{", "[") and text[-1:] in ("}", "]") else "text/plain"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
