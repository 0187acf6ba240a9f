"""``ms.Agent`` is a value users build and an App registers (``app.add``); its options
are declared once, and ``app.agent(...)`` takes exactly them."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mainspring as ms
from mainspring.testing import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


def lookup_order(order: int) -> dict[str, object]:
    """Read an order."""
    return {"order": order, "status": "shipped"}


LOOKUP = ms.tool(lookup_order)


class Opaque:
    """No fields pydantic can see: no JSON schema."""

    def __init__(self, handle: object) -> None:
        self.handle = handle


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedModel.call("lookup_order", {"order": 42}),
            ScriptedModel.call("finish", {"answer": "Order 42 has shipped"}),
        ]
    )


def _agent(name: str = "orders", **options: object) -> ms.Agent:
    return ms.Agent(
        name, model=_script(), instructions="Answer about orders.", tools=[LOOKUP], **options
    )


def test_an_agent_is_built_without_an_app_and_runs_once_added(tmp_path: Path) -> None:
    orders = _agent(limits=ms.Limits(max_steps=10))
    assert orders.allowed == ("lookup_order",) and orders.toolsets == ()
    assert [s.name for s in orders.tool_specs()] == ["lookup_order", "update_state", "finish"]
    app = ms.App(f"sqlite:///{tmp_path / 'a.db'}")
    workflow = app.add(orders)
    assert app.agents["orders"] is orders and app.workflows["orders"] is workflow
    assert "lookup_order" in app.tools  # its tools joined the App's registry
    assert app.add(orders) is workflow  # the same agent again: the same workflow
    result = asyncio.run(app.run(workflow, "Where is order 42?"))
    assert (result.status, result.answer, result.tool_calls) == ("done", "Order 42 has shipped", 1)
    app.close()


def test_one_agent_runs_in_two_apps(tmp_path: Path) -> None:
    """A value: each App binds it to its own store, clock and rate limits."""
    orders = _agent()
    answers = []
    for n in (1, 2):
        app = ms.App(f"sqlite:///{tmp_path / f'{n}.db'}")
        # a fresh script per App: ScriptedModel replies in order
        workflow = app.add(dataclasses.replace(orders, model=_script()))
        answers.append(asyncio.run(app.run(workflow, "Where?")).answer)
        app.close()
    assert answers == ["Order 42 has shipped"] * 2


def test_app_agent_is_app_add_of_an_agent_with_the_same_options(tmp_path: Path) -> None:
    options = list(inspect.signature(ms.Agent).parameters.values())
    forwarded = list(inspect.signature(ms.App.agent).parameters.values())
    assert forwarded[0].name == "self" and forwarded[1:] == options  # declared once
    app = ms.App(f"sqlite:///{tmp_path / 'a.db'}")
    workflow = app.agent("orders", model=_script(), instructions="x", tools=[LOOKUP], max_repairs=1)
    made = app.agents["orders"]
    assert isinstance(made, ms.Agent) and made.max_repairs == 1 and made.tools == (LOOKUP,)
    assert asyncio.run(app.run(workflow, "Where?")).answer == "Order 42 has shipped"
    app.close()


def test_a_name_is_registered_once(tmp_path: Path) -> None:
    app = ms.App(f"sqlite:///{tmp_path / 'a.db'}")
    app.add(_agent())
    with pytest.raises(ms.ConfigError, match="a workflow named 'orders' is already registered"):
        app.add(_agent())
    with pytest.raises(ms.ConfigError, match=r"app.add takes an agent .*got 'orders'"):
        app.add("orders")  # type: ignore[arg-type]
    app.close()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"tools": ["lookup_order"]}, r"agent 'bad': tools= takes tools .*got 'lookup_order'"),
        ({"deps": 42}, r"agent 'bad': deps must be a function"),
        ({"deps_type": dict}, r"agent 'bad': deps_type=.* needs deps="),
        ({"handoffs": ["billing"]}, r"agent 'bad': handoffs take agents"),
        (
            {"limits": ms.Limits(max_cost_usd=1.0)},
            r"agent 'bad' has max_cost_usd=1.0 but no price for model 'scripted'",
        ),
        ({"output_type": Opaque}, r"agent 'bad': output_type=.*Opaque.* no JSON schema"),
    ],
)
def test_a_bad_option_fails_where_the_agent_is_defined_and_names_it(
    options: dict[str, object], error: str, tmp_path: Path
) -> None:
    with pytest.raises(ms.ConfigError, match=error):
        ms.Agent("bad", model=ScriptedModel([]), instructions="x", **options)  # type: ignore[arg-type]
    app = ms.App(f"sqlite:///{tmp_path / 'a.db'}")
    with pytest.raises(ms.ConfigError, match=error):
        app.agent("bad", model=ScriptedModel([]), instructions="x", **options)  # type: ignore[arg-type]
    assert "bad" not in app.workflows
    with pytest.raises(TypeError, match="max_repair"):
        app.agent("bad", model=ScriptedModel([]), instructions="x", max_repair=3)  # type: ignore[call-arg]
    app.close()


def test_none_is_the_default_of_limits_and_context_as_app_agent_took_it() -> None:
    agent = _agent(limits=None, context=None)
    assert (agent.limits, agent.context) == (ms.Limits(), ms.ContextPolicy())


def test_a_variant_is_a_replaced_copy_checked_again() -> None:
    orders = _agent()
    strict = dataclasses.replace(orders, name="strict", max_repairs=0)
    assert (strict.max_repairs, strict.tools, orders.max_repairs) == (0, orders.tools, 3)
    with pytest.raises(ms.ConfigError, match="tools= takes tools"):
        dataclasses.replace(orders, tools=[print])


@pytest.mark.slow
def test_type_checkers_see_the_options_and_the_output_type(tmp_path: Path) -> None:
    snippet = tmp_path / "typed.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from typing import reveal_type

            import mainspring as ms

            @dataclass
            class Plan:
                steps: list[str]

            app = ms.App("sqlite:///x.db")
            reveal_type(app.add(ms.Agent("a", model="m", instructions="x", output_type=Plan)))
            reveal_type(app.agent("b", model="m", instructions="x", output_type=Plan))
            app.agent("c", model="m", instructions="x", max_repair=3)
            app.mcp.add("fs", comand=["server"])
            """
        )
    )
    cache = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", cache, str(snippet)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = done.stdout
    assert out.count("AgentWorkflow[typed.Plan]") == 2, out
    assert 'Unexpected keyword argument "max_repair" for "agent" of "App"' in out, out
    assert 'Unexpected keyword argument "comand" for "add" of "MCPServers"' in out, out
