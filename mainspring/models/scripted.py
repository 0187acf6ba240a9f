"""``ScriptedModel``: a deterministic model for tests and the demo.

It plays a script instead of thinking::

    model = ScriptedModel([
        ScriptedModel.call("lookup_ticket", {"id": 7}),          # turn 0: one tool call
        ScriptedModel.calls(("send_email", {"to": "a@b.c"}),     # turn 1: two at once
                            ("close_ticket", {"id": 7})),
        "All done.",                                             # turn 2: text, stop
    ])

A turn is a :class:`ModelResponse`, a string (a text reply), an exception instance (the
request raises it: ``RateLimited("slow down", retry_after=2)``), or a function of
``(messages, tools)`` returning one of those (it may be async). Instead of a list, one
such function can play every turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._errors import ConfigError
from ._base import Model
from ._common import estimate_input_tokens, estimate_tokens
from ._types import (
    AssistantMessage,
    Message,
    ModelResponse,
    ModelSettings,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

__all__ = ["ScriptFunction", "ScriptTurn", "ScriptedModel", "ScriptedRequest"]

TurnResult: TypeAlias = ModelResponse | str | BaseException
ScriptFunction: TypeAlias = Callable[
    [Sequence[Message], Sequence[ToolSpec]], TurnResult | Awaitable[TurnResult]
]
"""A function of ``(messages, tools)`` that plays a turn."""
ScriptTurn: TypeAlias = ModelResponse | str | BaseException | ScriptFunction
"""One turn of a script."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedRequest:
    """A request a :class:`ScriptedModel` received."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    settings: ModelSettings | None


def _arguments_text(arguments: Mapping[str, object] | str | None) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments  # verbatim, so tests can script malformed arguments
    return json.dumps(arguments)


class ScriptedModel(Model):
    """A model that replays a script, for tests and the demo.

    Args:
        turns: the script: a list of turns (see the module docs), or one function of
            ``(messages, tools)`` that plays every turn.
        model_id: the model's name (``name`` is ``"scripted:<model_id>"``).
        turn_from: which turn answers a request. ``"requests"``: the n-th request gets
            turn n. ``"history"``: the turn is the number of assistant messages in the
            request, so a retried request gets the same turn again and a fresh process
            recovering a run picks up where the conversation is (compaction that drops
            assistant messages moves it back, though).
        chunk_size: stream each reply's text, then its tool calls' arguments, in pieces
            of this many characters (:meth:`stream`; ``streams`` is then ``True``);
            ``None``: no streaming.
        on_chunk: called (and awaited, if async) with ``(index, piece)`` before each
            piece is handed out (text and arguments alike, numbered across the turn):
            a test pauses a stream mid-way here (awaiting an event) or ends it
            (raising).
        remote: stand in for a provider's API (:attr:`Model.remote`): the limits an App
            learns from headers then apply to it, as to a real provider (a test of the
            limiter). By default a scripted model is local: only limits declared for
            it apply.

    Attributes:
        requests: every request received, in order.

    A request past the end of the script raises :class:`ConfigError` (a test that
    scripted too few turns, not something to retry). Usage is estimated (UTF-8 bytes
    / 4) unless a scripted :class:`ModelResponse` carries its own, so budgets can be
    tested.
    """

    provider = "scripted"

    def __init__(
        self,
        turns: Sequence[ScriptTurn] | ScriptFunction,
        *,
        model_id: str = "scripted",
        turn_from: Literal["requests", "history"] = "requests",
        chunk_size: int | None = None,
        on_chunk: Callable[[int, str], Awaitable[None] | None] | None = None,
        remote: bool = False,
    ) -> None:
        # Played in this process: no provider's limits to learn, unless it stands in for
        # a provider (a test of the limiter) and says so.
        self.remote = remote
        if chunk_size is not None and chunk_size < 1:
            raise ConfigError(f"chunk_size must be a positive number, got {chunk_size!r}")
        self.chunk_size = chunk_size
        self.streams = chunk_size is not None
        self._on_chunk = on_chunk
        if turn_from not in ("requests", "history"):
            raise ConfigError(f"turn_from must be 'requests' or 'history', got {turn_from!r}")
        self.model_id = model_id
        self.name = f"scripted:{model_id}"
        self.turn_from = turn_from
        self._function: ScriptFunction | None = None
        self._turns: tuple[ScriptTurn, ...] = ()
        if callable(turns):
            self._function = turns
        elif isinstance(turns, str | ModelResponse):
            raise ConfigError(f"ScriptedModel wants a list of turns, got one: {turns!r:.100}")
        else:
            self._turns = tuple(turns)
        self.requests: list[ScriptedRequest] = []

    # -- building turns ------------------------------------------------------------------

    @staticmethod
    def call(
        name: str,
        arguments: Mapping[str, object] | str | None = None,
        *,
        id: str = "",
        text: str | None = None,
    ) -> ModelResponse:
        """A turn that calls one tool.

        Args:
            name: the tool.
            arguments: a dict (encoded as JSON) or raw argument text, sent verbatim
                (broken JSON included, to test repair).
            id: the call id; empty numbers it ``call_<turn>_<index>``.
            text: text the model says alongside the call.
        """
        call = ToolCall(id=id, name=name, arguments=_arguments_text(arguments))
        return ModelResponse(text=text, tool_calls=(call,), finish_reason="tool_calls")

    @staticmethod
    def calls(
        *calls: tuple[str, Mapping[str, object] | str] | ToolCall,
        text: str | None = None,
    ) -> ModelResponse:
        """A turn that calls several tools at once: ``calls(("a", {...}), ("b", {...}))``."""
        made = tuple(
            c
            if isinstance(c, ToolCall)
            else ToolCall(id="", name=c[0], arguments=_arguments_text(c[1]))
            for c in calls
        )
        return ModelResponse(text=text, tool_calls=made, finish_reason="tool_calls")

    # -- playing -------------------------------------------------------------------------

    @property
    def remaining(self) -> int | None:
        """Turns not played yet (``"requests"`` mode with a list), else ``None``."""
        if self._function is not None or self.turn_from != "requests":
            return None
        return max(0, len(self._turns) - len(self.requests))

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
        on_text: Callable[[str], None],
        on_tool_call: Callable[[ToolCallDelta], None] | None = None,
    ) -> ModelResponse:
        """Play the next turn, handing its text out in ``chunk_size`` pieces, then each
        tool call (its id and name first, then its arguments in ``chunk_size``
        pieces); see :meth:`Model.stream`. ``on_chunk`` sees every piece, numbered
        across the turn."""
        reply = await self.request(messages, tools=tools, settings=settings)
        text = reply.text or ""
        size = self.chunk_size or max(1, len(text))
        index = 0

        async def hand_out(piece: str, out: Callable[[str], None]) -> None:
            nonlocal index
            if self._on_chunk is not None:
                paused = self._on_chunk(index, piece)
                if inspect.isawaitable(paused):
                    await paused
            index += 1
            out(piece)
            await asyncio.sleep(0)  # let readers and writers of the stream run

        for start in range(0, len(text), size):
            await hand_out(text[start : start + size], on_text)
        if on_tool_call is None:
            return reply
        for i, call in enumerate(reply.tool_calls):

            def delta(piece: str, i: int = i, call: ToolCall = call) -> None:
                on_tool_call(ToolCallDelta(index=i, id=call.id, name=call.name, arguments=piece))

            delta("")  # the call begins: its id and name
            step = self.chunk_size or max(1, len(call.arguments))
            for start in range(0, len(call.arguments), step):
                await hand_out(call.arguments[start : start + step], delta)
        return reply

    async def request(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Play the next turn; see :meth:`Model.request`.

        Raises:
            ConfigError: the script has no turn for this request.
            BaseException: whatever exception the script says this turn raises.
        """
        messages, tools = tuple(messages), tuple(tools)
        self.requests.append(ScriptedRequest(messages=messages, tools=tools, settings=settings))
        if self.turn_from == "history":
            index = sum(isinstance(m, AssistantMessage) for m in messages)
        else:
            index = len(self.requests) - 1
        result = await self._play(index, messages, tools)
        if isinstance(result, BaseException):
            raise result
        return self._complete(result, index, messages, tools)

    async def _play(
        self, index: int, messages: tuple[Message, ...], tools: tuple[ToolSpec, ...]
    ) -> TurnResult:
        turn: ScriptTurn
        if self._function is not None:
            turn = self._function
        elif index < len(self._turns):
            turn = self._turns[index]
        else:
            last = messages[-1] if messages else None
            raise ConfigError(
                f"{self.name} ran out of script: it has {len(self._turns)} turns and was "
                f"asked for turn {index} (request #{len(self.requests)}); "
                f"the last message was {last!r:.200}"
            )
        if not callable(turn):
            return turn
        result = turn(messages, tools)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, ModelResponse | str | BaseException):
            raise ConfigError(
                f"{self.name}: turn {index}'s function returned {result!r:.100}; "
                "it must return a ModelResponse, a str or an exception"
            )
        return result

    def _complete(
        self,
        result: ModelResponse | str,
        index: int,
        messages: tuple[Message, ...],
        tools: tuple[ToolSpec, ...],
    ) -> ModelResponse:
        response = ModelResponse(text=result) if isinstance(result, str) else result
        calls = tuple(
            c if c.id else dataclasses.replace(c, id=f"call_{index}_{i}")
            for i, c in enumerate(response.tool_calls)
        )
        finish = response.finish_reason
        if calls and finish == "stop":
            finish = "tool_calls"
        usage = response.usage
        if usage == Usage():
            out = (response.text or "") + "".join(c.name + c.arguments for c in calls)
            usage = Usage(
                input_tokens=estimate_input_tokens(messages, tools),
                output_tokens=estimate_tokens(out),
            )
        return dataclasses.replace(
            response,
            tool_calls=calls,
            finish_reason=finish,
            usage=usage,
            model=response.model or self.model_id,
        )
