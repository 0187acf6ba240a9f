"""``FakeOpenAIServer``: OpenAI's Chat Completions wire protocol on 127.0.0.1."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

from ._fake_common import (
    FakeProviderServer,
    FakeReply,
    RecordedRequest,
    call_id,
    pieces,
    rate_limited_headers,
)
from ._fake_limits import Dim, Refusal, format_duration
from ._fake_responses import render_response, response_events

__all__ = ["FakeOpenAIServer"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
    429: "requests",
}


class FakeOpenAIServer(FakeProviderServer):
    """A fake OpenAI endpoint: ``POST /v1/chat/completions`` (``stream: true`` served as
    chunks) and ``POST /v1/responses`` (the Responses API, the OpenAI Agents SDK's
    default; streamed as its real events), one script for both.

    The official ``openai`` SDK (and :class:`~mainspring.models.OpenAIModel`) talk to
    it unmodified: function-calling ``tool_calls``, ``usage``, ``x-ratelimit-*`` headers,
    and errors as ``{"error": {"message", "type", "code", "param"}}`` with OpenAI's
    statuses::

        with FakeOpenAIServer() as server:
            server.script([
                server.tool_call("add", {"a": 1, "b": 2}),
                server.rate_limited(retry_after=2),
                server.text("3"),
            ])
            model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="sk-test")
            ...
            assert server.requests[0].body["tools"][0]["function"]["name"] == "add"

    See :class:`~mainspring.testing._fake_common.FakeProviderServer` for the arguments.
    """

    endpoint = "/v1/chat/completions"
    endpoints = ("/v1/responses",)
    RATE_LIMIT_WORDS: Mapping[Dim, str] = {"rpm": "requests", "tpm": "tokens"}
    DEFAULT_RATE_LIMIT_HEADERS: Mapping[str, str] = {
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-limit-tokens": "2000000",
        "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-remaining-tokens": "1999000",
        "x-ratelimit-reset-requests": "6ms",
        "x-ratelimit-reset-tokens": "30ms",
    }

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, as the OpenAI SDK's ``base_url`` wants it."""
        return f"{self.url}/v1"

    # -- error builders ------------------------------------------------------------------

    @staticmethod
    def error(
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> FakeReply:
        """An error reply: ``{"error": {"message", "type", "code", "param"}}``."""
        if type is None:
            type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
        error = {"message": message, "type": type, "param": param, "code": code}
        return FakeReply(
            status=status, error={"error": error}, headers=headers or {}, delay_s=delay_s
        )

    @staticmethod
    def rate_limited(
        retry_after: float | None = 1.0,
        *,
        dimension: str = "tokens",
        headers: Mapping[str, str] | None = None,
    ) -> FakeReply:
        """A 429 for rate, with ``retry-after`` (seconds) unless ``retry_after`` is None,
        and the exhausted dimension's ``x-ratelimit-remaining-*`` at 0."""
        sent = rate_limited_headers(f"x-ratelimit-remaining-{dimension}", retry_after, headers)
        return FakeOpenAIServer.error(
            429,
            f"Rate limit reached for gpt-4.1-mini on {dimension} per min (TPM): "
            f"Limit 30000, Used 30000. Please try again in {retry_after or 1:g}s.",
            type=dimension,
            code="rate_limit_exceeded",
            headers=sent,
        )

    @staticmethod
    def quota_exhausted() -> FakeReply:
        """OpenAI's 429 ``insufficient_quota``: out of credit, not out of rate."""
        return FakeOpenAIServer.error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            type="insufficient_quota",
            code="insufficient_quota",
        )

    @staticmethod
    def context_overflow(limit: int = 128000, used: int = 130000) -> FakeReply:
        """OpenAI's 400 ``context_length_exceeded``."""
        return FakeOpenAIServer.error(
            400,
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {used} tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
            param="messages",
        )

    @staticmethod
    def overloaded(retry_after: float | None = None) -> FakeReply:
        """OpenAI's 503 when the engine is overloaded (``retry-after`` if given)."""
        headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
        return FakeOpenAIServer.error(
            503,
            "The engine is currently overloaded, please try again later.",
            type="server_error",
            headers=headers,
        )

    @staticmethod
    def server_error(status: int = 500) -> FakeReply:
        """A 5xx, as OpenAI words it."""
        return FakeOpenAIServer.error(
            status, "The server had an error while processing your request. Sorry about that!"
        )

    # -- the wire ------------------------------------------------------------------------

    def _error(self, status: int, message: str) -> FakeReply:
        return self.error(status, message)

    def _bucket_headers(self) -> dict[str, str]:
        if self.buckets is None:
            return {}
        out: dict[str, str] = {}
        for dim, (limit, left, full_in) in self.buckets.state().items():
            word = self.RATE_LIMIT_WORDS.get(dim)
            if word is not None:
                out[f"x-ratelimit-limit-{word}"] = f"{limit:.0f}"
                out[f"x-ratelimit-remaining-{word}"] = f"{math.floor(left)}"
                out[f"x-ratelimit-reset-{word}"] = format_duration(full_in)
        return out

    def _refused(self, refusal: Refusal, request: RecordedRequest) -> FakeReply:
        body = request.body if isinstance(request.body, Mapping) else {}
        model = str(body.get("model") or "gpt-4.1-mini")
        word = self.RATE_LIMIT_WORDS.get(refusal.dim, "tokens")
        what = "requests per min (RPM)" if word == "requests" else "tokens per min (TPM)"
        if refusal.too_large:
            message = (
                f"Request too large for {model} in organization org-fake on {what}: "
                f"Limit {refusal.limit:.0f}, Requested {refusal.requested:.0f}. The input or "
                "output tokens must be reduced in order to run successfully. Visit "
                "https://platform.openai.com/account/rate-limits to learn more."
            )
        else:
            message = (
                f"Rate limit reached for {model} in organization org-fake on {what}: "
                f"Limit {refusal.limit:.0f}, Used {refusal.used:.0f}, Requested "
                f"{refusal.requested:.0f}. Please try again in "
                f"{format_duration(refusal.retry_after)}. Visit "
                "https://platform.openai.com/account/rate-limits to learn more."
            )
        headers = self._bucket_headers()
        if not refusal.too_large:
            headers["retry-after-ms"] = f"{math.ceil(refusal.retry_after * 1000)}"
            headers["retry-after"] = f"{math.ceil(refusal.retry_after)}"
        return self.error(429, message, type=word, code="rate_limit_exceeded", headers=headers)

    def _api_key_of(self, request: RecordedRequest) -> str | None:
        auth = request.headers.get("authorization", "")
        return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None

    def _unauthorized(self) -> FakeReply:
        return self.error(
            401,
            "Incorrect API key provided. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            code="invalid_api_key",
        )

    def _render_reply(self, reply: FakeReply, request: RecordedRequest, n: int) -> dict[str, Any]:
        body = request.body if isinstance(request.body, Mapping) else {}
        if _is_responses(request):
            return render_response(reply, body, self._usage(reply, request), n)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text,
            "refusal": reply.refusal,
            "annotations": [],
        }
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id(call, n, i),
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments
                        if isinstance(call.arguments, str)
                        else json.dumps(call.arguments),
                    },
                }
                for i, call in enumerate(reply.tool_calls)
            ]
        reason = reply.stop_reason or ("tool_calls" if reply.tool_calls else "stop")
        usage = self._usage(reply, request)
        return {
            "id": f"chatcmpl-fake{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or "fake"),
            "system_fingerprint": "fp_fake",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
            ],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        }

    def _stream_events(
        self, body: Mapping[str, Any], request: RecordedRequest
    ) -> list[tuple[str | None, str]]:
        """The reply as ``chat.completion.chunk`` events ending in ``[DONE]``: a role
        chunk, the text in pieces, each tool call (id and name, then its arguments in
        pieces), the finish reason, and the usage chunk when ``stream_options`` asks
        for it."""
        if _is_responses(request):
            return response_events(body, pieces)
        asked = request.body if isinstance(request.body, Mapping) else {}
        choice = body["choices"][0]
        message = choice["message"]
        head = {k: body[k] for k in ("id", "object", "created", "model", "system_fingerprint")}
        head["object"] = "chat.completion.chunk"
        out: list[tuple[str | None, str]] = []

        def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            out.append((None, json.dumps({**head, "choices": choices})))

        chunk({"role": "assistant", "content": "", "refusal": None})
        for piece in pieces(message.get("content") or ""):
            chunk({"content": piece})
        if message.get("refusal"):
            chunk({"refusal": message["refusal"]})
        for i, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            start = {"index": i, "id": call["id"], "type": "function"}
            chunk(
                {"tool_calls": [{**start, "function": {"name": function["name"], "arguments": ""}}]}
            )
            for piece in pieces(function["arguments"]):
                chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        chunk({}, choice["finish_reason"])
        options = asked.get("stream_options")
        if isinstance(options, Mapping) and options.get("include_usage"):
            out.append((None, json.dumps({**head, "choices": [], "usage": body["usage"]})))
        out.append((None, "[DONE]"))
        return out


def _is_responses(request: RecordedRequest) -> bool:
    return request.path.split("?", 1)[0] == "/v1/responses"
