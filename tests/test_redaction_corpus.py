"""The redactor against a corpus of secret shapes, in every place a secret sits in
JSON: a plain string, a value under an innocent key, a value under a secret-named
key, and JSON held inside a string (a tool call's arguments). And a clean corpus
that must come out unchanged (no false positives on token counts and plain URLs)."""

from __future__ import annotations

import json

import pytest

from mainspring.observability import Redactor
from mainspring.storage import redact_url

R = Redactor()
GONE = "[REDACTED]"

# (name, text holding a secret, the secret part that must disappear)
CORPUS: list[tuple[str, str, str]] = [
    ("openai", "key sk-proj-AbCdEfGhIjKlMnOpQrStUv12", "AbCdEfGhIjKlMnOpQrStUv12"),
    ("anthropic", "sk-ant-api03-AbCdEfGhIjKlMnOp", "AbCdEfGhIjKlMnOp"),
    ("aws id", "AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    ("github", "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "AbCdEfGhIjKlMnOpQrStUvWxYz"),
    ("gitlab", "glpat-AbCdEfGhIjKlMnOpQrSt", "AbCdEfGhIjKlMnOpQrSt"),
    ("slack", "xoxb-1234567890-AbCdEfGh", "AbCdEfGh"),
    ("google", "AIzaSyA-AbCdEfGhIjKlMnOpQrStUvWxYz0123", "AbCdEfGhIjKlMnOpQrStUvWxYz"),
    ("stripe", "sk_live_AbCdEfGhIjKlMnOpQrStUv", "AbCdEfGhIjKlMnOpQrStUv"),
    ("sendgrid", "SG.AbCdEfGhIjKlMnOpQr.StUvWxYz0123456789ab", "StUvWxYz0123456789ab"),
    ("huggingface", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "AbCdEfGhIjKlMnOpQrStUvWxYz"),
    ("mainspring", "msk_0a1b2c3d4e5f_AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    (
        "jwt",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P",
        "dozjgNryP4J3jVmNHl0w5N",
    ),
    (
        "pem",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n"
        "-----END OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXktdjEAAAA",
    ),
    ("url password", "postgresql://app:Hunter2Pw@db.internal:5432/x", "Hunter2Pw"),
    ("bearer", "Authorization: Bearer abcdefgh12345678", "abcdefgh12345678"),
    ("basic", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    ("password=", "login with password=Hunter2Pw please", "Hunter2Pw"),
    ("db_password=", "DB_PASSWORD=Hunter2Pw", "Hunter2Pw"),
    ("sslpassword", "host=db sslpassword=Hunter2Pw", "Hunter2Pw"),
    ("auth_token:", "auth_token: Hunter2Pw", "Hunter2Pw"),
    ("aws secret=", "aws_secret_access_key=wJalrXUtnFEMIK7MDENG", "wJalrXUtnFEMIK7MDENG"),
]
SECRET_KEYS = [
    "password", "db_password", "aws_secret_access_key", "token", "auth_token",
    "sessionToken", "x-api-key", "apiKey", "client_secret", "private_key", "credentials",
]  # fmt: skip
CLEAN = [
    {"usage": {"input_tokens": 307, "output_tokens": 9}, "max_tokens": 100},
    {"tokenizer": "cl100k_base", "url": "https://example.com/a?b=c", "basic": "plan"},
    "see https://example.com/docs and sqlite:///mainspring.db",
    {"text": "the password policy is long; tokens: 5"},
]


@pytest.mark.parametrize(("name", "text", "secret"), CORPUS, ids=[c[0] for c in CORPUS])
def test_each_secret_shape_is_redacted_wherever_it_sits(name: str, text: str, secret: str) -> None:
    assert secret in text
    assert secret not in R.redact_text(text)
    for value in (
        text,
        {"note": text},
        [{"deep": {"er": f"prefix {text} suffix"}}],
        {"arguments": json.dumps({"note": text})},  # JSON inside a string
    ):
        out = R.redact_json(json.dumps(value))
        assert secret not in out, (name, out)
        assert GONE in out
        json.loads(out)  # still JSON


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_named_keys_are_redacted(key: str) -> None:
    for value in ({key: "opaque-value-1"}, {"arguments": json.dumps({key: "opaque-value-1"})}):
        out = R.redact_json(json.dumps(value))
        assert "opaque-value-1" not in out, (key, out)


@pytest.mark.parametrize("value", CLEAN)
def test_clean_values_are_unchanged(value: object) -> None:
    text = json.dumps(value)
    assert R.redact_json(text) == text


def test_redact_url_hides_every_password() -> None:
    assert redact_url("postgresql://u:PW@h/db") == "postgresql://u:***@h/db"
    assert "PW" not in redact_url("postgresql://u@h/db?sslpassword=PW&sslmode=require")
    assert "PW" not in redact_url("postgresql://h/db?password=PW")
    assert "PW" not in redact_url("host=h sslpassword=PW dbname=x")
    assert "PW" not in redact_url("host=h password='P W' dbname=x").replace("P W", "")
    assert redact_url("sqlite:///mainspring.db") == "sqlite:///mainspring.db"
