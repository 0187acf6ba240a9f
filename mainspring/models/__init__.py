"""Models: the :class:`Model` extension point, provider adapters and test models.

A model is named by a spec string that :func:`resolve_model` turns into a
:class:`Model`::

    openai:gpt-4.1-mini                              OpenAI
    anthropic:claude-sonnet-4-5                      Anthropic
    openai:llama3@http://127.0.0.1:11434/v1          any OpenAI-compatible endpoint
                                                     (vLLM, Ollama, llama.cpp, LM Studio)
    anthropic:claude-sonnet-4-5@https://gateway/     another endpoint of Anthropic's API

That is ``PROVIDER:MODEL_ID`` with an optional ``@BASE_URL`` (``http://`` or
``https://``; for OpenAI-compatible servers, ``/v1`` included). Keys come from
``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``; build the adapter yourself to pass one.

The provider SDKs are optional extras, imported only when an adapter is first used:
``pip install 'mainspring[openai]'`` / ``'mainspring[anthropic]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ._base import Model
from ._common import estimate_input_tokens as estimate_input_tokens
from ._common import estimate_tokens
from ._common import reset_seconds as reset_seconds
from ._stepnames import model_step_name as model_step_name
from ._stepnames import without_endpoint as without_endpoint
from ._types import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelResponse,
    ModelSettings,
    SystemMessage,
    ToolCall,
    ToolCallDelta,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from .faulty import FaultKind, FaultProfile, FaultyModel
from .scripted import ScriptedModel, ScriptedRequest

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .openai import OpenAIModel

__all__ = [
    "AnthropicModel",
    "AssistantMessage",
    "FaultKind",
    "FaultProfile",
    "FaultyModel",
    "FinishReason",
    "Message",
    "Model",
    "ModelResponse",
    "ModelSettings",
    "OpenAIModel",
    "ScriptedModel",
    "ScriptedRequest",
    "SystemMessage",
    "ToolCall",
    "ToolCallDelta",
    "ToolResultMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
    "estimate_tokens",
    "parse_model_spec",
]

# For the floors above (see docs/architecture.md, "Layers"), never for users:
__internal__ = (
    "estimate_input_tokens",
    "model_step_name",
    "reset_seconds",
    "resolve_model",
    "without_endpoint",
)

PROVIDERS = ("openai", "anthropic")


def __getattr__(name: str) -> Any:
    # The adapters import their SDK, which costs seconds: only on first use.
    if name == "OpenAIModel":
        from .openai import OpenAIModel

        return OpenAIModel
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _bad(spec: str, why: str) -> ConfigError:
    return ConfigError(
        f"bad model spec {spec!r}: {why}. Expected 'openai:MODEL', 'anthropic:MODEL' or "
        "'openai:MODEL@http://host:port/v1' for an OpenAI-compatible endpoint"
    )


def parse_model_spec(spec: str) -> tuple[str, str, str | None]:
    """``(provider, model_id, base_url)`` of a spec string (see the module docs).

    Raises:
        ConfigError: the spec does not have that form or names an unknown provider.
    """
    provider, sep, rest = spec.strip().partition(":")
    if not sep:
        raise _bad(spec, "no provider prefix")
    provider = provider.strip().lower()
    if provider not in PROVIDERS:
        raise _bad(spec, f"unknown provider {provider!r} (known: {', '.join(PROVIDERS)})")
    base_url: str | None = None
    # Split at "@http" so that a model id may itself contain "@" (e.g. "model@2024").
    for scheme in ("@http://", "@https://"):
        at = rest.find(scheme)
        if at >= 0:
            rest, base_url = rest[:at], rest[at + 1 :]
            break
    else:
        if "@" in rest and "://" in rest:
            raise _bad(spec, "the base URL after '@' must start with http:// or https://")
    model_id = rest.strip()
    if not model_id:
        raise _bad(spec, "empty model id")
    if base_url is not None and base_url.rstrip("/") in ("http:", "https:"):
        raise _bad(spec, "empty base URL")
    return provider, model_id, base_url


def resolve_model(spec: str | Model) -> Model:
    """The :class:`Model` a spec names (a ``Model`` is returned as it is).

    Raises:
        ConfigError: the spec is malformed or names an unknown provider.
        ImportError: the provider's SDK is not installed (the message names the
            ``pip install`` to run).
    """
    if isinstance(spec, Model):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(f"a model is a Model or a spec string, got {spec!r:.100}")
    provider, model_id, base_url = parse_model_spec(spec)
    if provider == "openai":
        from .openai import OpenAIModel

        return OpenAIModel(model_id, base_url=base_url)
    from .anthropic import AnthropicModel

    return AnthropicModel(model_id, base_url=base_url)
