"""The mailer for ``mainspring worker examples.mailer.worker_app:app``.

Reads ``MAINSPRING_DATABASE_URL`` (the store), ``MAILER_LEDGER`` (the mail API's
ledger file) and ``MAILER_SEND_S`` (the API's latency, default 0).
"""

from __future__ import annotations

import os

import mainspring as ms
from mainspring.models import ScriptedModel
from mainspring.testing import EffectLedger

from .pipeline import MailerConfig, build, writer_turn

if not os.environ.get("MAILER_LEDGER"):
    raise ms.ConfigError("examples.mailer.worker_app needs MAILER_LEDGER (a ledger file path)")

app = ms.App()
mail_api = EffectLedger(os.environ["MAILER_LEDGER"])
latency = float(os.environ.get("MAILER_SEND_S", "0"))
mail_customers = build(
    app,
    mail_api,
    ScriptedModel(writer_turn, model_id="email-writer"),
    MailerConfig(send_s=latency, reply_s=latency),
)
