"""The customer mailer: 200 customers tiered by rules, a personalised email each, a
reviewer's approval before anything is sent, the delivery status of every email
recorded in the journal, and each customer mailed exactly once however often the
worker dies (the mail API deduplicates by the step's idempotency key).

``python -m examples.mailer`` runs it in-process; ``examples.mailer.worker_app:app`` is
the same workflow for ``mainspring worker`` (tests/test_examples.py kills one mid-send).
"""

from .pipeline import Customer, Delivery, Email, MailerConfig, build, customers, tier_of

__all__ = ["Customer", "Delivery", "Email", "MailerConfig", "build", "customers", "tier_of"]
