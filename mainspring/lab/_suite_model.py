"""The horizon suite's model provider: OpenAI Chat Completions on 127.0.0.1.

Every contender talks to the same provider over the real wire with its own client (the
official ``openai`` SDK, LangChain's, the Agents SDK's), so the suite measures what the
contender does with a provider, not what an in-process fake lets it skip. For each
request the server:

1. finds the run from the task text in the first user message (``"<task> batch
   <label>"``) and numbers the request among the label's requests;
2. draws the request's :class:`~mainspring.lab.ProviderFaults` fault (seeded by seed,
   label and that number) and, on a hit, answers it: a 500 or 503 in OpenAI's error
   JSON, a 429 with ``retry-after`` and ``x-ratelimit-*`` headers, or a reply held
   past the client timeout. A faulted request is not a paid call;
3. otherwise plays :func:`~mainspring.lab.decide` (rng seeded by seed, label and the
   label's paid calls) on the conversation (the last tool result, the last call), answers
   its one tool call (arguments as a JSON string, malformed when the policy errs), and
   records the paid call and its tokens in the world.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .. import ConfigError
from ..models import Usage, estimate_tokens
from ..testing import FakeOpenAIServer, FakeReply, RecordedRequest
from ._suite_faults import ProviderFault, SuiteFaults
from ._tasks import TASKS, PolicyRates, SuiteWorld, decide

__all__ = ["SuiteModelServer"]

_TASK = re.compile(r"\b(\w+) batch (\w+)")


def _text(content: Any) -> str:
    """A message's content as text (a string, or OpenAI's list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _task_label(messages: Sequence[Any]) -> tuple[str, str] | None:
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            found = _TASK.search(_text(message.get("content")))
            if found and found.group(1) in TASKS:
                return found.group(1), found.group(2)
    return None


def _seen(messages: Sequence[Any]) -> tuple[str | None, tuple[str, str] | None]:
    """The latest tool result's text and the latest call ``(tool, arguments)``: what a
    model reading its history goes by (a repair request or a nudge after the result
    does not erase it)."""
    result: str | None = None
    call: tuple[str, str] | None = None
    for message in reversed(messages):
        if not isinstance(message, Mapping):
            continue
        if result is None and message.get("role") == "tool":
            result = _text(message.get("content"))
        if call is None and message.get("role") == "assistant" and message.get("tool_calls"):
            function = message["tool_calls"][0].get("function") or {}
            call = (str(function.get("name")), str(function.get("arguments")))
        if result is not None and call is not None:
            break
    return result, call


class SuiteModelServer(FakeOpenAIServer):
    """The suite's provider for one cell: plays the policy and injects provider faults.

    Usage::

        with SuiteModelServer("world.db") as server:   # configured by SuiteFaults
            client = openai.OpenAI(base_url=server.base_url, api_key="sk-suite",
                                   timeout=server.client_timeout_s, max_retries=0)

    Args:
        world_path: the cell's world file, configured by :meth:`SuiteFaults.configure`
            (its seed, the policy's rates and the provider faults).
        keep_requests: how many recent requests ``requests`` keeps (long runs send
            thousands of ever longer conversations).

    It wants the API key ``sk-suite`` (a 401 otherwise, as OpenAI says it).

    Attributes:
        client_timeout_s: the timeout every contender sets on its client; a timeout
            fault answers after it.

    Raises:
        ConfigError: the world file was never configured.
    """

    def __init__(self, world_path: str | os.PathLike[str], *, keep_requests: int = 100) -> None:
        super().__init__(api_key="sk-suite", fallback=self._play)
        self.world = SuiteWorld(world_path)
        self.faults = SuiteFaults(world_path)
        settings = self.faults.settings()
        if settings is None:
            raise ConfigError(
                f"SuiteModelServer: the world file {self.world.path!r} is not configured "
                "(call SuiteFaults(path).configure(seed, kills, provider) first)"
            )
        self.seed = settings.seed
        self.provider = settings.provider
        self.policy = PolicyRates(**settings.policy)
        self.client_timeout_s = settings.provider.timeout_s
        self.keep_requests = keep_requests

    def stop(self) -> None:
        super().stop()
        self.world.close()
        self.faults.close()

    def fault_reply(self, kind: ProviderFault, n: int) -> FakeReply:
        """The reply of a faulted request (``n`` picks 500 or 503 for a server error)."""
        faults = self.provider
        if kind == "rate_limited":
            wait = faults.retry_after_s
            return self.rate_limited(
                wait,
                dimension="requests",
                headers={
                    "retry-after-ms": f"{round(wait * 1000)}",
                    "x-ratelimit-limit-requests": "500",
                    "x-ratelimit-reset-requests": f"{wait:g}s",
                },
            )
        if kind == "timeout":
            # Held past the client's deadline (and answered as a server error, should a
            # client wait that long anyway).
            late = faults.timeout_s * 1.5 + 1.0
            return self.error(504, "Gateway timeout", type="server_error", delay_s=late)
        return self.overloaded() if n % 2 else self.server_error(500)

    def _play(self, request: RecordedRequest) -> FakeReply:
        # Long runs send thousands of ever longer conversations: keep the latest few.
        del self.requests[: max(0, len(self.requests) - self.keep_requests)]
        body = request.body if isinstance(request.body, Mapping) else {}
        messages = body.get("messages") or []
        found = _task_label(messages)
        if found is None:
            return self.error(
                400,
                "SuiteModelServer: no user message names the run ('<task> batch <label>', "
                f"a task of {sorted(TASKS)})",
                param="messages",
            )
        task, label = found
        n = self.faults.next_request(label)
        kind = self.provider.draw(self.seed, label, n)
        if kind is not None:
            self.faults.record_provider_fault(label, n, kind)
            return self.fault_reply(kind, n)
        result, call = _seen(messages)
        made, _ = self.world.model_calls(label)
        rng = random.Random(f"horizon:{self.seed}:{label}:{made}")
        tool, arguments, error = decide(TASKS[task], result, call, rng, self.policy)
        if error is not None:
            self.world.record_injected(label, error)
        usage = Usage(
            input_tokens=self.estimate_input_tokens(body),
            output_tokens=estimate_tokens(tool + arguments),
        )
        self.world.record_model_call(label, usage.input_tokens + usage.output_tokens)
        return self.tool_call(tool, arguments, usage=usage)
