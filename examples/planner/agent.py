"""The three agents, the publisher's tool, and the turns their scripted models play."""

from __future__ import annotations

from dataclasses import dataclass, field

import mainspring as ms
from mainspring.testing import ScriptedModel

__all__ = ["Team", "build"]

call = ScriptedModel.call


@dataclass
class Team:
    """The planner (what to run) and what the example checks afterwards."""

    planner: ms.Workflow[[str], ms.AgentResult]
    # what publish_post published: exactly one post, approved first
    published: list[dict[str, str]] = field(default_factory=list)


def build(app: ms.App) -> Team:
    """Register the researcher, the publisher and the planner on ``app``."""
    published: list[dict[str, str]] = []

    @app.tool(effect="irreversible")
    def publish_post(title: str, body: str, *, ctx: ms.ToolContext) -> str:
        """Publish a post on the team's blog (cannot be undone)."""
        published.append({"title": title, "body": body, "key": ctx.idempotency_key})
        return f"published {title!r}"

    researcher = app.agent(
        "researcher",
        model=ScriptedModel(
            [
                call(
                    "finish", {"answer": "Durable runs journal each step and replay after a crash."}
                )
            ],
            model_id="researcher",
        ),
        instructions="Find the facts the task asks for; answer with them only.",
    )
    publisher = app.agent(
        "publisher",
        model=ScriptedModel(
            [
                call(
                    "publish_post",
                    {"title": "Why durable runs", "body": "They journal each step."},
                ),
                call("finish", {"answer": "The post 'Why durable runs' is published."}),
            ],
            model_id="publisher",
        ),
        instructions="Publish what you are given as a blog post.",
        tools=[publish_post],
    )
    planner = app.agent(
        "planner",
        model=ScriptedModel(
            [
                call("research", {"task": "What makes a run durable? One sentence."}),
                call("publish", {"task": "Publish a post: runs journal each step."}),
                call("finish", {"answer": "Researched, written and published."}),
            ],
            model_id="planner",
        ),
        instructions="Plan the work; delegate research and publishing to the specialists.",
        tools=[
            researcher.as_tool(name="research", description="Ask the research specialist."),
            publisher.as_tool(name="publish", description="Ask the publishing specialist."),
        ],
    )
    return Team(planner=planner, published=published)
