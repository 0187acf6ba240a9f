"""``FakeAnthropicServer``: Anthropic's Messages API wire protocol on 127.0.0.1."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ._fake_common import (
    FakeProviderServer,
    FakeReply,
    FakeToolCall,
    RecordedRequest,
    call_id,
    pieces,
    rate_limited_headers,
)
from ._fake_limits import Dim, Refusal

__all__ = ["FakeAnthropicServer"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_DIMENSIONS = ("requests", "tokens", "input-tokens", "output-tokens")


def _tool_input(call: FakeToolCall) -> Any:
    if not isinstance(call.arguments, str):
        return dict(call.arguments)
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments  # not an object: a malformed reply, on purpose


class FakeAnthropicServer(FakeProviderServer):
    """A fake Anthropic endpoint, ``POST /v1/messages`` (``stream: true`` served as its events).

    The official ``anthropic`` SDK (and :class:`~mainspring.models.AnthropicModel`) talk
    to it unmodified: ``text`` and ``tool_use`` content blocks, ``stop_reason``, ``usage``
    with the cache counters, ``anthropic-ratelimit-*`` headers, and errors as
    ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's statuses
    (529 ``overloaded_error`` included)::

        with FakeAnthropicServer() as server:
            server.script([server.overloaded(), server.text("done")])
            model = AnthropicModel("claude-sonnet-4-5", base_url=server.base_url,
                                   api_key="sk-ant-test")

    See :class:`~mainspring.testing._fake_common.FakeProviderServer` for the arguments.
    """

    endpoint = "/v1/messages"
    RATE_LIMIT_WORDS: Mapping[Dim, str] = {
        "rpm": "requests",
        "tpm": "tokens",
        "itpm": "input-tokens",
        "otpm": "output-tokens",
    }
    # Anthropic: cache reads count toward no input-token limit.
    CACHE_READS_COUNT = False
    DEFAULT_RATE_LIMIT_HEADERS: Mapping[str, str] = {
        "anthropic-ratelimit-requests-limit": "4000",
        "anthropic-ratelimit-requests-remaining": "3999",
        "anthropic-ratelimit-tokens-limit": "2400000",
        "anthropic-ratelimit-tokens-remaining": "2399000",
        "anthropic-ratelimit-input-tokens-limit": "2000000",
        "anthropic-ratelimit-input-tokens-remaining": "1999000",
        "anthropic-ratelimit-output-tokens-limit": "400000",
        "anthropic-ratelimit-output-tokens-remaining": "399900",
    }

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``, as the Anthropic SDK's ``base_url`` wants it."""
        return self.url

    # -- error builders ------------------------------------------------------------------

    @staticmethod
    def error(
        status: int,
        message: str,
        *,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> FakeReply:
        """An error reply: ``{"type": "error", "error": {"type", "message"}}``."""
        if type is None:
            type = _ERROR_TYPES.get(status, "api_error")
        body = {
            "type": "error",
            "error": {"type": type, "message": message},
            "request_id": "req_fake",
        }
        return FakeReply(status=status, error=body, headers=headers or {}, delay_s=delay_s)

    @staticmethod
    def rate_limited(
        retry_after: float | None = 1.0,
        *,
        dimension: str = "input-tokens",
        headers: Mapping[str, str] | None = None,
    ) -> FakeReply:
        """A 429 ``rate_limit_error`` with ``retry-after`` (seconds) unless it is None, and
        the exhausted dimension's ``anthropic-ratelimit-*-remaining`` at 0."""
        sent = rate_limited_headers(
            f"anthropic-ratelimit-{dimension}-remaining", retry_after, headers
        )
        return FakeAnthropicServer.error(
            429,
            f"This request would exceed the rate limit for your organization of "
            f"{dimension.replace('-', ' ')} per minute.",
            headers=sent,
        )

    @staticmethod
    def overloaded() -> FakeReply:
        """Anthropic's 529 ``overloaded_error``."""
        return FakeAnthropicServer.error(529, "Overloaded")

    @staticmethod
    def server_error(status: int = 500) -> FakeReply:
        """A 5xx ``api_error``."""
        return FakeAnthropicServer.error(status, "Internal server error")

    @staticmethod
    def context_overflow(limit: int = 200000, used: int = 210000) -> FakeReply:
        """Anthropic's 400 for a prompt longer than the context window."""
        return FakeAnthropicServer.error(
            400, f"prompt is too long: {used} tokens > {limit} maximum"
        )

    @staticmethod
    def quota_exhausted() -> FakeReply:
        """Anthropic's 400 for an account out of credit."""
        return FakeAnthropicServer.error(
            400,
            "Your credit balance is too low to access the Anthropic API. Please go to "
            "Plans & Billing to upgrade or purchase credits.",
        )

    # -- the wire ------------------------------------------------------------------------

    def _error(self, status: int, message: str) -> FakeReply:
        return self.error(status, message)

    def _api_key_of(self, request: RecordedRequest) -> str | None:
        key = request.headers.get("x-api-key")
        if key is None and request.headers.get("authorization", "").startswith("Bearer "):
            key = request.headers["authorization"].removeprefix("Bearer ")
        return key

    def _unauthorized(self) -> FakeReply:
        return self.error(401, "invalid x-api-key")

    def _bucket_headers(self) -> dict[str, str]:
        if self.buckets is None:
            return {}
        now = datetime.now(UTC)
        out: dict[str, str] = {}
        for dim, (limit, left, full_in) in self.buckets.state().items():
            prefix = f"anthropic-ratelimit-{self.RATE_LIMIT_WORDS[dim]}"
            out[f"{prefix}-limit"] = f"{limit:.0f}"
            out[f"{prefix}-remaining"] = f"{math.floor(left)}"
            out[f"{prefix}-reset"] = _rfc3339(now + timedelta(seconds=full_in))
        return out

    def _refused(self, refusal: Refusal, request: RecordedRequest) -> FakeReply:
        what = {
            "rpm": "requests",
            "tpm": "tokens",
            "itpm": "input tokens",
            "otpm": "output tokens",
        }[refusal.dim]
        if refusal.too_large:
            message = (
                f"This request would exceed the rate limit for your organization (org-fake) "
                f"of {refusal.limit:,.0f} {what} per minute: it asks for "
                f"{refusal.requested:,.0f} at once. Please reduce the prompt length or the "
                "maximum tokens requested."
            )
        else:
            message = (
                f"This request would exceed the rate limit for your organization (org-fake) "
                f"of {refusal.limit:,.0f} {what} per minute. For details, refer to: "
                "https://docs.claude.com/en/api/rate-limits. You can see the response headers "
                "for current usage. Please reduce the prompt length or the maximum tokens "
                "requested, or try again later. You may also contact sales at "
                "https://www.anthropic.com/contact-sales to discuss your options for a rate "
                "limit increase."
            )
        headers = self._bucket_headers()
        if not refusal.too_large:
            headers["retry-after"] = f"{max(1, math.ceil(refusal.retry_after))}"
        return self.error(429, message, headers=headers)

    def _rate_limit_headers(self, request: RecordedRequest) -> dict[str, str]:
        headers = super()._rate_limit_headers(request)
        # Full buckets reset "now"; the stamp is RFC 3339, as Anthropic sends it.
        now = _rfc3339(datetime.now(UTC))
        for dim in _DIMENSIONS:
            prefix = f"anthropic-ratelimit-{dim}"
            if f"{prefix}-limit" in headers:
                headers.setdefault(f"{prefix}-reset", now)
        return headers

    def _render_reply(self, reply: FakeReply, request: RecordedRequest, n: int) -> dict[str, Any]:
        body = request.body if isinstance(request.body, Mapping) else {}
        content: list[dict[str, Any]] = []
        text = reply.refusal if reply.refusal is not None else reply.text
        if text:
            content.append({"type": "text", "text": text})
        content.extend(
            {
                "type": "tool_use",
                "id": call_id(call, n, i, prefix="toolu"),
                "name": call.name,
                "input": _tool_input(call),
            }
            for i, call in enumerate(reply.tool_calls)
        )
        if reply.stop_reason is not None:
            stop = reply.stop_reason
        elif reply.refusal is not None:
            stop = "refusal"
        else:
            stop = "tool_use" if reply.tool_calls else "end_turn"
        usage = self._usage(reply, request)
        cached = usage.cache_read_tokens + usage.cache_write_tokens
        return {
            "id": f"msg_fake{n}",
            "type": "message",
            "role": "assistant",
            "model": str(body.get("model") or "fake"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                # Anthropic counts cached prompt tokens apart from input_tokens.
                "input_tokens": max(0, usage.input_tokens - cached),
                "output_tokens": usage.output_tokens,
                "cache_creation_input_tokens": usage.cache_write_tokens,
                "cache_read_input_tokens": usage.cache_read_tokens,
                "service_tier": "standard",
            },
        }

    def _stream_events(
        self, body: Mapping[str, Any], request: RecordedRequest
    ) -> list[tuple[str | None, str]]:
        return _stream_events(body)


def _rfc3339(when: datetime) -> str:
    """A time as Anthropic's reset headers write it: ``2026-01-01T00:00:07Z``."""
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _event(name: str, data: dict[str, Any]) -> tuple[str | None, str]:
    return name, json.dumps({"type": name, **data})


def _stream_events(body: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """A Messages API reply as its streamed events: ``message_start`` (no content,
    the input usage), per block ``content_block_start`` / ``content_block_delta``
    (``text_delta`` or ``input_json_delta``) / ``content_block_stop``, then
    ``message_delta`` (stop reason, output usage) and ``message_stop``."""
    usage = dict(body["usage"])
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}
    out = [_event("message_start", {"message": start}), ("ping", json.dumps({"type": "ping"}))]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            opened = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in ["", *pieces(json.dumps(block["input"]))]
            ]
        out.append(_event("content_block_start", {"index": index, "content_block": opened}))
        out.extend(_event("content_block_delta", {"index": index, "delta": d}) for d in deltas)
        out.append(_event("content_block_stop", {"index": index}))
    delta = {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]}
    out.append(
        _event(
            "message_delta", {"delta": delta, "usage": {"output_tokens": usage["output_tokens"]}}
        )
    )
    out.append(_event("message_stop", {}))
    return out
