"""Runnable examples of mainspring: ``python -m examples.<name>`` from the repository root.

- :mod:`mainspring.examples.migration` (inside the package, so an installed wheel has
  it): a staged data migration with schemas, validators, a stage gate, idempotent
  writes and compensation (``mainspring demo`` runs it).
- :mod:`examples.mailer`: 200 customers tiered by rules, personalised emails, approval
  before sending, delivery status recorded, each email sent exactly once.
- :mod:`examples.research_agent`: an agent whose work spans several sessions, each
  starting from the hand-off the previous one left.
- :mod:`examples.planner`: a planner agent delegating to two specialist agents (as
  tools, each a child run), one of which asks a person to approve its irreversible tool.
"""
