""":meth:`App.shadow <mainspring.App.shadow>`: the candidate is the App it is called on
(its workflows, tools and agents, as the code about to ship defines them), with the
overrides it is given; the recorded runs come from its database or another one. See
:mod:`._shadow` for how a shadow runs and what it reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._errors import ConfigError
from ..agent import Agent, AgentLoop, AgentWorkflow
from ..journal import StepInterceptor
from ..limits import Price
from ..models import Model, resolve_model
from ..storage import Store
from ._agents import workflow_of
from ._shadow import Reads, ShadowOptions, recorded_runs, shadow
from ._shadow_journal import RecordedRun
from ._shadow_verdict import ShadowReport

__all__ = ["app_shadow"]


def _candidate(agent: Agent, changes: Mapping[str, Any], app: Any) -> tuple[Agent, AgentWorkflow]:
    """The agent as the shadow runs it: with the overrides, bound as ``app`` binds it
    but booking no rate limit in the App's own store (the shadow's database is the only
    one it writes)."""
    spec = dataclasses.replace(agent, **changes)
    loop = AgentLoop(
        agent=spec, tools=app.tools, clock=app.clock, rng=app.rng, inline_wait_s=app.inline_wait_s
    )
    return spec, workflow_of(loop)


async def app_shadow(
    self: Any,
    runs: Iterable[str | RecordedRun] | None = None,
    *,
    workflows: Sequence[str] | None = None,
    statuses: Sequence[str] | None = None,
    since: float | datetime | timedelta | None = None,
    until: float | datetime | timedelta | None = None,
    limit: int = 100,
    database: str | Store | None = None,
    from_step: int | str = 0,
    model: str | Model | None = None,
    instructions: str | None = None,
    stubs: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
    reads: Reads = "journal",
    prices: dict[str, Price] | None = None,
    scratch: str | None = None,
) -> ShadowReport:
    """Re-run recorded runs against this App's code (the candidate) with no effect
    reaching the world, and say where the decisions part (docs/lab.md, "Shadow runs").

    Each run is run again under its own id and input in a scratch database (a
    temporary SQLite file unless ``scratch`` names one) by this App's workflow of its
    name, its agents changed by ``model`` and ``instructions`` if given. The recorded
    database is only read (a URL is opened read-only). Steps before ``from_step`` are
    answered from the recorded journal; from there the candidate decides, its model
    live. Every ``write`` and ``irreversible`` tool (and every plain step not marked
    ``read``) is answered by its stub in ``stubs`` if given, else by the recorded result
    of the matching call (tool name and arguments, else tool name and the order of the
    calls), else by a :class:`ShadowStubMissing` error the model sees; the real tool
    never runs. Requests to people are answered as the recorded run's people answered
    them; an approval with no recorded decision is approved by "mainspring shadow".

    Args:
        runs: run ids (any status), or :class:`RecordedRun` s (a regression suite's).
            Default: the runs ``workflows``, ``statuses``, ``since`` and ``until`` pick.
        workflows: only runs of these workflows (agents).
        statuses: only runs in these statuses (``["failed"]``).
        since / until: created in this window: a time (epoch seconds or a
            ``datetime``) or a ``timedelta`` back from now (``since=timedelta(days=7)``).
        limit: at most this many runs picked by filter (the newest), listed oldest first.
        database: the recorded runs' database (a URL or a store); default this App's.
        from_step: the journal position the candidate decides from: ``12`` or
            ``"1:4"`` (session:seq); default the start.
        model / instructions: the candidate's model and instructions for every agent.
        stubs: tool name -> a function of the call's arguments returning its result.
        reads: ``"journal"`` (default): ``read`` tools answered from the recorded run
            like effects; ``"live"``: run them for real.
        prices: USD per million tokens per model id, for the cost of both sides.
        scratch: the database the shadows are written to (a URL); default a
            temporary SQLite file, deleted after.

    Returns:
        A :class:`ShadowReport`: per run the first reply that differs, the calls whose
        arguments changed, tokens, cost and outcome before and after, and how each
        effect was stubbed; ``.to_dict()``; ``mainspring.lab.shadow_html`` and
        ``save_regressions`` write its HTML page and regression suite.
    """
    given = None if runs is None else list(runs)
    recordings = [r for r in given or () if isinstance(r, RecordedRun)]
    ids = [r for r in given or () if isinstance(r, str)]
    if given is None or ids:
        source = database if database is not None else self.store
        recordings += recorded_runs(
            source, ids or None, workflows=workflows, statuses=statuses, since=since,
            until=until, limit=limit,
        )  # fmt: skip
    recordings = list({r.run.id: r for r in recordings}.values())  # each run once
    if scratch is not None and database is not None and scratch == database:
        raise ConfigError("shadow: scratch= must not be the recorded runs' database")
    changes: dict[str, Any] = {}
    if model is not None:
        changes["model"] = resolve_model(model)
    if instructions is not None:
        changes["instructions"] = instructions
    options = ShadowOptions(
        from_step=from_step,
        stubs=dict(stubs or {}),
        reads=reads,
        prices=prices,
        candidate={
            "model": None if model is None else getattr(changes["model"], "name", str(model)),
            "instructions": instructions,
            "from_step": from_step,
            "reads": reads,
            "stubs": sorted(stubs or {}),
        },
    )

    def scratch_app(store: Store, stand: StepInterceptor) -> Any:
        app = type(self)(store, interceptors=[stand], poll_interval_s=0.0, rate_limits=False)
        app.workflows.update(self.workflows)
        app.tools = self.tools
        for name, agent in self.agents.items():
            app.agents[name], app.workflows[name] = _candidate(agent, changes, self)
        return app

    return await shadow(recordings, scratch_app, options, scratch)
