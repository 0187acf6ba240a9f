"""A research agent whose work spans several sessions.

``session_turns=3`` ends each session after three turns; the next session starts from
the hand-off (the structured state — plan, facts, progress notes — and a summary of the
earlier sessions) instead of the old context window. The scripted model's last turn
writes its answer from the facts it finds in the hand-off, so the answer shows what
was carried across sessions. ``python -m examples.research_agent`` runs it.
"""

from .agent import CORPUS, build, script

__all__ = ["CORPUS", "build", "script"]
