"""Secret redaction: applied to every journal payload before it is stored.

The journal is JSON text. A quick scan of the text decides whether anything looks
like a secret (the common case, nothing does, costs one regex search); only then is
the JSON decoded, every string cleaned (including JSON held inside strings, such as
a tool call's ``arguments``) and the values of secret-named keys replaced, and the
result encoded again. Working on decoded strings keeps the output valid JSON
whatever a configured pattern matches.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError

__all__ = [
    "BUILTIN_PATTERNS",
    "SECRET_KEYS",
    "SECRET_KEY_WORDS",
    "LiveRedaction",
    "Redactor",
    "is_secret_key",
]

# Common credential shapes. Each group 1 (when present) is kept: "Bearer [REDACTED]".
BUILTIN_PATTERNS: tuple[str, ...] = (
    r"sk-ant-[A-Za-z0-9_\-]{8,}",  # Anthropic
    r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}",  # OpenAI
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key id
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"glpat-[A-Za-z0-9_\-]{20,}",  # GitLab
    r"xox[abposr]-[A-Za-z0-9\-]{8,}",  # Slack
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google API key
    r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe
    r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",  # SendGrid
    r"hf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"msk_[0-9a-f]{12}_[A-Za-z0-9_\-]{20,}",  # mainspring's own API keys
    r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
    # PEM private keys (RSA, EC, OPENSSH, ENCRYPTED, PKCS#8), header to footer.
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
    # A password inside a URL: scheme://user:PASSWORD@host keeps scheme://user:
    r"(?i)(\b[a-z][a-z0-9+.\-]*://[^\s:/@\"'<>]*:)[^\s/@\"'<>]+(?=@)",
    r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}",
    r"(?i)(\bbasic\s+)[A-Za-z0-9+/]{8,}={0,2}",  # HTTP Basic credentials
    # name=value and name: value where the name says secret (db_password=, sslpassword=,
    # auth_token:, aws_secret_access_key=, x-api-key:), but not max_tokens= or tokens:.
    r"(?i)(\b[a-z0-9_\-]*?(?:password|passwd|pwd|secret|api[_-]?key|apikey|token)"
    r"(?:[_\-][a-z0-9_\-]*)?\s*[=:]\s*)[^\s\"'&,;]+",
)
# Cheap first look (substrings of the lower-cased text): the patterns above can only
# match where one of these occurs, and one search for literals is much cheaper.
_BUILTIN_HINTS: tuple[str, ...] = (
    "sk-", "akia", "asia", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-",
    "xox", "aiza", "sk_", "rk_", "sg.", "hf_", "msk_", "eyj", "private key", "://",
    "bearer", "basic", "password", "passwd", "pwd", "secret", "api_key", "api-key",
    "apikey", "token", "credential", "authorization",
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
# And keys whose words include one of these (``db_password``, ``aws_secret_access_key``,
# ``auth_token``, ``x-api-key``, ``sessionToken``): their string values are replaced.
# Whole words, so ``max_tokens`` and ``tokenizer`` are not secrets.
SECRET_KEY_WORDS: tuple[str, ...] = (
    "password", "passwd", "pwd", "passphrase", "secret", "token", "apikey", "credential",
    "credentials", "authorization", "cookie",
)  # fmt: skip
_KEY_PAIRS = (("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"))
# The same test inside a JSON string ("…\"db_password\": \"…\"…"), as a regex.
_KEY_NAME = (
    r"[^\"\\]*?(?:passw(?:or)?d|passphrase|secret|token(?!s|izer)|api[_\-]?key"
    r"|private[_\-]?key|credential|authorization)[^\"\\]*"
)


def is_secret_key(name: str) -> bool:
    """Does an object key name a secret (by its words: see :data:`SECRET_KEY_WORDS`)?"""
    if name.lower() in SECRET_KEYS:
        return True
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    if any(w in SECRET_KEY_WORDS for w in words):
        return True
    pairs = set(itertools.pairwise(words))
    return any(pair in pairs for pair in _KEY_PAIRS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Redactor:
    """What to hide from the journal, traces and exports.

    Args:
        patterns: extra regular expressions; a match is replaced. If a pattern has a
            group 1, that part is kept (``r"(card=)\\d+"`` keeps ``card=``).
        keys: extra object keys whose values are always replaced (case-insensitive).
        builtin: also apply :data:`BUILTIN_PATTERNS`, :data:`SECRET_KEYS` and
            :data:`SECRET_KEY_WORDS` (API-key shapes of OpenAI, Anthropic, AWS,
            GitHub, GitLab, Slack, Google, Stripe, SendGrid, Hugging Face and
            mainspring; JWTs; PEM private keys; passwords in URLs; bearer and HTTP
            Basic credentials; ``db_password=...``; values of keys named like
            ``*password*``, ``*secret*``, ``*token*``, ``*api_key*``).
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
        if self.builtin:
            key_alt = f"{key_alt}|{_KEY_NAME}" if key_alt else _KEY_NAME
        key_value = (
            # "password": "..." inside a string (a tool call's JSON arguments).
            re.compile(rf'(?i)("(?:{key_alt})"\s*:\s*)"(?:[^"\\]|\\.)*"') if key_alt else None
        )
        # In the raw JSON text a nested key's quotes are escaped: \"password\":
        detect = text + (rf'|(?i:\\?"(?:{key_alt})\\?"\s*:)' if key_alt else "")
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

    def live(self) -> LiveRedaction:
        """A redaction of text that arrives in pieces (a model's streamed reply): what
        it releases, joined, is :meth:`redact_text` of the whole text."""
        return LiveRedaction(self)

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
            return {k: self._entry(k, v) for k, v in value.items()}
        return value

    def _entry(self, key: Any, value: Any) -> Any:
        if not isinstance(key, str) or value in (None, ""):
            return self._value(value)
        if key.lower() in self._keys:
            return self.replacement
        # Named like a secret: its text goes (numbers such as a token count stay).
        if self.builtin and isinstance(value, str) and is_secret_key(key):
            return self.replacement
        return self._value(value)


# Appended to the text held back, one of these completes any builtin pattern left open
# at its end but a PEM key (waited for apart): a token's characters after "Bearer " or
# "password=", the "=" after "password ", the colon and quotes of a JSON key's string
# value ("password" : "…"). A match of the probed text that crosses a cut means a
# secret may cross it.
_TAIL = "A" * 40 + '@"'
_PROBES = (_TAIL, "=" + _TAIL, ':"' + _TAIL, '"' + _TAIL)
# A PEM block's header, from which text is held until its footer has come.
_PEM_FOOTER = re.compile(r"-----END [^\n]*?-----")
# Held back at most: past it the text goes out (redacted as far as it is known).
_MAX_HOLD = 8192
# Characters held back besides the last word when the Redactor has patterns of its own,
# whose matches can span whitespace and whose prefixes the probe cannot complete.
_CUSTOM_HOLD = 256


class LiveRedaction:
    """Redacts text that arrives in pieces, holding back what a secret may still span.

    :meth:`feed` returns the redacted text that is safe to show now and keeps the
    rest; :meth:`end` releases it. A cut only ever falls right after whitespace (so a
    key, a token or a JWT, which have none, is never split) and never inside a match
    of the patterns over the held text plus a probe that completes any builtin
    pattern left open (``Bearer `` waiting for its token, a PEM key for its footer,
    ``"password": "`` for its closing quote). So the pieces released, joined, are
    exactly :meth:`Redactor.redact_text` of the whole text, for every builtin pattern
    and for custom patterns whose matches are at most 256 characters long; at most
    8 KiB is held back.
    """

    def __init__(self, redactor: Redactor) -> None:
        self._r = redactor
        self._held = ""
        self._hold = _CUSTOM_HOLD if redactor._custom is not None else 0

    def feed(self, text: str) -> str:
        """Take the next piece; return the redacted text that can be shown now."""
        buf = self._held + text
        cut = self._cut(buf)
        if cut == 0 and len(buf) > _MAX_HOLD:
            cut = len(buf)
        self._held = buf[cut:]
        return self._r.redact_text(buf[:cut]) if cut else ""

    def end(self) -> str:
        """The text still held back, redacted: the stream is over."""
        buf, self._held = self._held, ""
        return self._r.redact_text(buf) if buf else ""

    def _cut(self, buf: str) -> int:
        cut = _after_space(buf, len(buf) - self._hold)
        r = self._r
        # A builtin pattern matches only where one of its hints occurs, and a match
        # that crosses a cut after whitespace has its hint before the cut, but for a
        # PEM key, whose header has spaces before "PRIVATE KEY".
        if cut == 0:
            return 0
        begin = buf.rfind("-----BEGIN")
        if r._custom is None and begin < 0 and not r._hints.search(buf.lower()):
            return cut
        if begin >= 0 and not _PEM_FOOTER.search(buf, begin):
            cut = min(cut, _after_space(buf, begin))  # a key (or certificate) is coming
        patterns = (r._text, r._key_value) if r._key_value is not None else (r._text,)
        while cut > 0:
            starts = [
                m.start()
                for probe in _PROBES
                for pattern in patterns
                for m in pattern.finditer(buf + probe)
                if m.start() < cut < m.end()
            ]
            if not starts:
                return cut
            cut = _after_space(buf, min(starts))
        return 0


def _after_space(text: str, limit: int) -> int:
    """The last place at or before ``limit`` that follows whitespace (0: none)."""
    for i in range(min(limit, len(text)), 0, -1):
        if text[i - 1].isspace():
            return i
    return 0


def _scoped(source: str) -> str:
    """``(?i)abc`` → ``(?i:abc)``: a leading inline flag applies to this pattern only."""
    m = re.match(r"\(\?([aiLmsux]+)\)", source)
    if m:
        return f"(?{m.group(1)}:{source[m.end() :]})"
    return f"(?:{source})"
