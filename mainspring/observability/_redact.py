"""Secret redaction: applied to every journal payload before it is stored.

The journal is JSON text. A quick scan of the text decides whether anything looks
like a secret (the common case, nothing does, costs one regex search); only then is
the JSON decoded, every string cleaned (including JSON held inside strings, such as
a tool call's ``arguments``) and the values of secret-named keys replaced, and the
result encoded again. Working on decoded strings keeps the output valid JSON
whatever a configured pattern matches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError

__all__ = ["BUILTIN_PATTERNS", "SECRET_KEYS", "Redactor"]

# Common credential shapes. Each group 1 (when present) is kept: "Bearer [REDACTED]".
BUILTIN_PATTERNS: tuple[str, ...] = (
    r"sk-ant-[A-Za-z0-9_\-]{8,}",  # Anthropic
    r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}",  # OpenAI
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key id
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"xox[abposr]-[A-Za-z0-9\-]{8,}",  # Slack
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google API key
    r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}",
    r"(?i)(\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|token)\s*[=:]\s*)"
    r"[^\s\"'&,;]+",
)
# Cheap first look (substrings of the lower-cased text): the patterns above can only
# match where one of these occurs, and one search for literals is much cheaper.
_BUILTIN_HINTS: tuple[str, ...] = (
    "sk-", "akia", "asia", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox",
    "aiza", "bearer", "password", "passwd", "pwd", "secret", "api_key", "api-key", "apikey",
    "token=", "token:", "token =", "token :",
)  # fmt: skip
# Values of object keys with these names are replaced whatever they look like.
SECRET_KEYS: tuple[str, ...] = (
    "password",
    "passwd",
    "secret",
    "client_secret",
    "api_key",
    "apikey",
    "access_token",
    "refresh_token",
    "authorization",
    "private_key",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Redactor:
    """What to hide from the journal, traces and exports.

    Args:
        patterns: extra regular expressions; a match is replaced. If a pattern has a
            group 1, that part is kept (``r"(card=)\\d+"`` keeps ``card=``).
        keys: extra object keys whose values are always replaced (case-insensitive).
        builtin: also apply :data:`BUILTIN_PATTERNS` and :data:`SECRET_KEYS`
            (API-key shapes of OpenAI, Anthropic, AWS, GitHub, Slack, Google; bearer
            tokens; ``password=...``).
        replacement: what a secret becomes.

    Redaction happens before a value is journaled, so a replay sees exactly what the
    first execution saw: the redacted value. A step that returns a secret therefore
    hands ``[REDACTED]`` to the rest of the workflow; read secrets from the
    environment inside the steps that need them instead.
    """

    patterns: Sequence[str] = ()
    keys: Sequence[str] = ()
    builtin: bool = True
    replacement: str = "[REDACTED]"
    _text: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _detect: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _keys: frozenset[str] = field(init=False, repr=False, compare=False)
    _hints: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _custom: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _key_value: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sources = [*(BUILTIN_PATTERNS if self.builtin else ()), *self.patterns]
        for source in self.patterns:
            try:
                re.compile(source)
            except re.error as exc:
                raise ConfigError(f"redaction pattern {source!r} is not a regex: {exc}") from None
        keys = frozenset(k.lower() for k in (*(SECRET_KEYS if self.builtin else ()), *self.keys))
        # Inline flags such as (?i) must lead: wrap each pattern as a scoped group.
        text = "|".join(_scoped(s) for s in sources) or r"(?!x)x"
        key_alt = "|".join(re.escape(k) for k in sorted(keys))
        key_value = (
            # "password": "..." inside a string (a tool call's JSON arguments).
            re.compile(rf'(?i)("(?:{key_alt})"\s*:\s*)"(?:[^"\\]|\\.)*"') if keys else None
        )
        # In the raw JSON text a nested key's quotes are escaped: \"password\":
        detect = text + (rf'|(?i:\\?"(?:{key_alt})\\?"\s*:)' if keys else "")
        hints = (*(_BUILTIN_HINTS if self.builtin else ()), *sorted(keys))
        custom = "|".join(_scoped(s) for s in self.patterns)
        object.__setattr__(self, "_hints", re.compile("|".join(map(re.escape, hints)) or r"(?!x)x"))
        object.__setattr__(self, "_custom", re.compile(custom) if custom else None)
        object.__setattr__(self, "_text", re.compile(text))
        object.__setattr__(self, "_detect", re.compile(detect))
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_key_value", key_value)

    def redact_json(self, text: str) -> str:
        """Redact JSON text; returns ``text`` itself (the same object) when clean."""
        if not self._suspect(text):
            return text
        try:
            value = json.loads(text)
        except ValueError:
            return self.redact_text(text)
        cleaned = self._value(value)
        return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))

    def redact_text(self, text: str) -> str:
        """Redact plain text (a log line, an error message)."""
        if not self._suspect(text):
            return text
        out = self._text.sub(self._replace, text)
        if self._key_value is not None:
            out = self._key_value.sub(lambda m: f'{m.group(1)}"{self.replacement}"', out)
        return out

    def redact_value(self, value: Any) -> Any:
        """Redact a decoded JSON value (dicts, lists, strings)."""
        return self._value(value)

    __call__ = redact_json

    def _suspect(self, text: str) -> bool:
        if self._custom is not None and self._custom.search(text):
            return True
        if not self._hints.search(text.lower()):
            return False
        return self._detect.search(text) is not None

    def _replace(self, m: re.Match[str]) -> str:
        kept = next((g for g in m.groups() if g is not None), "")
        return kept + self.replacement

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, list):
            return [self._value(v) for v in value]
        if isinstance(value, dict):
            return {
                k: (
                    self.replacement
                    if isinstance(k, str) and k.lower() in self._keys and v not in (None, "")
                    else self._value(v)
                )
                for k, v in value.items()
            }
        return value


def _scoped(source: str) -> str:
    """``(?i)abc`` → ``(?i:abc)``: a leading inline flag applies to this pattern only."""
    m = re.match(r"\(\?([aiLmsux]+)\)", source)
    if m:
        return f"(?{m.group(1)}:{source[m.end() :]})"
    return f"(?:{source})"
