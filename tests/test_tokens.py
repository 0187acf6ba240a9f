"""Token counts from the bundled tokenizer, and estimates corrected by reported usage."""

from __future__ import annotations

from collections.abc import Sequence

import mainspring as ms
from mainspring.context import counter_for
from mainspring.models import Message, ModelResponse, ToolSpec, Usage, UserMessage
from mainspring.testing import ScriptedModel


def test_bundled_cl100k_counts_like_tiktoken() -> None:
    counter = counter_for("openai")
    assert counter.exact
    assert counter.text("tiktoken is great!") == 6  # tiktoken's README example
    assert counter.text("hello world") == 2
    assert counter.text("<|endoftext|>") > 1  # special tokens in user text are plain text
    assert counter_for("anthropic").exact


def test_unknown_models_fall_back_to_bytes_over_four() -> None:
    counter = counter_for("scripted")
    assert not counter.exact
    assert counter.text("x" * 400) == 100
    assert counter.messages([UserMessage(content="x" * 400)]) == 104  # + per-message


class _Reporting(ScriptedModel):
    """A scripted model that says it is an OpenAI model and reports ``factor`` times
    the real prompt size as its usage."""

    provider = "openai"

    def __init__(self, turns: int, factor: float) -> None:
        def play(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse:
            n = len(self.requests)
            size = counter_for("openai").messages(list(messages), list(tools))
            usage = Usage(input_tokens=int(size * factor), output_tokens=10)
            name, args = ("finish", {"answer": "ok"}) if n > turns else ("read", {"page": n})
            calls = ScriptedModel.call(name, args).tool_calls
            return ModelResponse(tool_calls=calls, usage=usage, finish_reason="tool_calls")

        super().__init__(play)


async def test_reported_usage_corrects_the_estimate(app: ms.App) -> None:
    @app.tool
    def read(page: int) -> str:
        return f"page {page} " + "words " * 150

    shown: dict[float, int] = {}
    for factor in (1.0, 3.0):
        model = _Reporting(turns=12, factor=factor)
        agent = app.agent(
            f"reader-{factor:g}",
            model=model,
            instructions="Read.",
            tools=[read],
            context=ms.ContextPolicy(recent_turns=8, max_input_tokens=2500),
        )
        result = await app.run(agent, "read")
        assert result.status == "done"
        last = model.requests[-1].messages
        shown[factor] = sum(1 for m in last if m.kind == "assistant")
    # Told its prompts are three times larger than counted, the agent shows fewer turns.
    assert shown[3.0] < shown[1.0]
