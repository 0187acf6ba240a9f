"""What a journal step name says about the step, for traces and metrics."""

from __future__ import annotations

__all__ = ["model_of", "step_kind"]


def step_kind(name: str) -> str:
    """``model``, ``tool``, ``rate`` (a rate-limit booking) or ``step``, from a step
    function's journal name."""
    head = name.split(":", 1)[0]
    return head if head in ("model", "tool", "rate") and ":" in name else "step"


def model_of(name: str) -> str:
    """The logical model (``provider:model``) of a ``model:...`` step name, without
    the endpoint URL (and its credentials) that older journals append after ``@``:
    ``model:openai:gpt-4.1@http://user:pass@proxy/v1`` -> ``openai:gpt-4.1``."""
    logical = name[len("model:") :] if name.startswith("model:") else name
    scheme = logical.find("://")
    if scheme != -1:
        at = logical.rfind("@", 0, scheme)
        logical = logical[:at] if at != -1 else logical[:scheme]
    return logical
