"""The JSON forms of what mainspring stores and serves.

Values go into the journal as JSON encoded with pydantic (never pickle) and come
back as plain JSON values, or as the type the code declares. These are the functions
the server, the dashboard and the lab use to read journaled values, and that your own
tools may use on exported rows (``RunRecord.input``, ``StepRecord.output``...).
"""

from ._public import public_error
from ._serde import decode, dumps, loads, return_type_problem, revive

__all__ = ["decode", "dumps", "loads", "public_error", "return_type_problem", "revive"]
