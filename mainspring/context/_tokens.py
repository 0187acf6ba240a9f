"""Token counts for context budgets, without a network.

tiktoken fetches its BPE files from the internet on first use; mainspring ships
``cl100k_base`` (its SHA-256 is checked against tiktoken's own expected hash) and
builds the encoding from it directly, so neither the network nor tiktoken's cache
directory nor the process environment is touched. OpenAI and Anthropic models are
counted with it (Anthropic's tokenizer is not public: an approximation that the
reported usage then corrects); any other model is counted as UTF-8 bytes / 4.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from ..models import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
    estimate_tokens,
)

__all__ = ["TokenCounter", "counter_for"]

_CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
_PER_MESSAGE = 4  # role and separators, as OpenAI's cookbook counts them


@lru_cache(maxsize=1)
def _cl100k() -> Any:
    """The cl100k_base encoding from the bundled file, or None without tiktoken."""
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - tiktoken is a dependency
        return None
    data = resources.files("mainspring.context").joinpath("data/cl100k_base.tiktoken").read_bytes()
    if hashlib.sha256(data).hexdigest() != _CL100K_SHA256:
        raise RuntimeError("mainspring's bundled cl100k_base.tiktoken is damaged: reinstall")
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    return tiktoken.Encoding(
        name="cl100k_base",
        pat_str=_CL100K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=_CL100K_SPECIAL,
    )


class TokenCounter:
    """Counts the tokens of text, messages and tool schemas for one kind of model."""

    def __init__(self, encoding: Any | None) -> None:
        self._encoding = encoding

    @property
    def exact(self) -> bool:
        """True when a BPE tokenizer counts (not the bytes / 4 estimate)."""
        return self._encoding is not None

    def text(self, text: str) -> int:
        if not text:
            return 0
        if self._encoding is None:
            return estimate_tokens(text)
        return len(self._encoding.encode(text, disallowed_special=()))

    def messages(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
        total = 0
        for m in messages:
            total += _PER_MESSAGE
            if isinstance(m, SystemMessage | UserMessage):
                total += self.text(m.content)
            elif isinstance(m, AssistantMessage):
                total += self.text(m.text or "")
                total += sum(self.text(c.name) + self.text(c.arguments) for c in m.tool_calls)
            elif isinstance(m, ToolResultMessage):
                total += self.text(m.content)
        for t in tools:
            total += self.text(t.name) + self.text(t.description)
            total += self.text(json.dumps(t.parameters))
        return total


def counter_for(provider: str) -> TokenCounter:
    """The counter for a provider's models: BPE for OpenAI and Anthropic, else bytes / 4."""
    if provider in ("openai", "anthropic"):
        return TokenCounter(_cl100k())
    return TokenCounter(None)
