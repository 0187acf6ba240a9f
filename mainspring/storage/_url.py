"""Database URLs as they may be shown: never with a password."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """The URL (or libpq ``key=value`` string) with any password replaced by ``***``."""
    if "://" not in url:  # a libpq "key=value" string
        return re.sub(
            r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url, flags=re.I
        )
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    # password=, sslpassword= and any other secret-named parameter (token, api_key…).
    query = re.sub(
        r"(^|&)([^&=]*(?:password|passwd|secret|token|api[_-]?key)[^&=]*=)[^&]*",
        r"\1\2***",
        parts.query,
        flags=re.I,
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # nothing to hide (and urlunsplit would drop sqlite:///'s empty host)
    return urlunsplit(parts._replace(netloc=netloc, query=query))
