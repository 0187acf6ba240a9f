"""Tools: schemas from type hints, tolerant argument parsing, messages a model can act
on, calls as journaled steps, truncated results, allowlists."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

import mainspring as ms
import mainspring.tools
from mainspring.models._types import ToolSpec
from mainspring.tools import Effect, Tool, ToolContext, ToolRegistry, tool
from mainspring.tools._docstring import parse_docstring


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str
    zip: str | None = None


@dataclass
class LineItem:
    sku: str
    qty: int = 1


class Color(Enum):
    RED = "red"
    BLUE = "blue"


@tool(effect="write")
def send_email(
    to: str,
    subject: str,
    body: str = "",
    urgency: Literal["low", "normal", "high"] = "normal",
    cc: list[str] | None = None,
    address: Address | None = None,
    items: list[LineItem] = [],  # noqa: B006 - a schema default, never mutated
    *,
    ctx: ToolContext,
) -> dict[str, Any]:
    """Send an email to one recipient.

    The mail server deduplicates on the idempotency key.

    Args:
        to: The recipient's address,
            like ``ann@example.com``.
        subject (str): The subject line.
        body: The text of the message.
        urgency: How soon it must be read.
        cc: Addresses to copy.

    Returns:
        The server's receipt.
    """
    return {"to": to, "key": ctx.idempotency_key}


def _noop() -> None:
    pass


def _walk(node: Any, parents: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*parents, key), value
            yield from _walk(value, (*parents, key))
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value, parents)


# -- schema -----------------------------------------------------------------------------


def test_schema_of_a_realistic_tool() -> None:
    spec = send_email.spec()
    assert isinstance(spec, ToolSpec)
    assert spec.name == "send_email"
    assert spec.description == (
        "Send an email to one recipient.\n\nThe mail server deduplicates on the idempotency key."
    )
    params = spec.parameters
    assert params["type"] == "object"
    assert params["additionalProperties"] is False
    assert params["required"] == ["to", "subject"]
    props = params["properties"]
    assert list(props) == ["to", "subject", "body", "urgency", "cc", "address", "items"]
    assert "ctx" not in props  # filled at call time, never shown to the model
    assert props["to"] == {
        "type": "string",
        "description": "The recipient's address, like ``ann@example.com``.",
    }
    assert props["subject"]["description"] == "The subject line."
    assert props["body"]["default"] == ""
    assert props["urgency"] == {
        "type": "string",
        "enum": ["low", "normal", "high"],
        "default": "normal",
        "description": "How soon it must be read.",
    }
    assert props["cc"]["anyOf"] == [
        {"type": "array", "items": {"type": "string"}},
        {"type": "null"},
    ]
    # Nested models and dataclasses are inlined: no $ref for providers to trip on.
    address = props["address"]["anyOf"][0]
    assert address["description"] == "A postal address."
    assert address["required"] == ["street", "city"]
    assert props["items"]["items"]["properties"]["qty"] == {"type": "integer", "default": 1}
    assert "$defs" not in params
    assert not [path for path, _ in _walk(params) if path[-1] in ("title", "$ref")]
    assert spec.parameters is not send_email.spec().parameters  # callers get a copy


def test_a_property_named_title_survives_the_title_cleanup() -> None:
    @tool
    def create_page(title: str, tags: list[str]) -> str:
        return title

    props = create_page.spec().parameters["properties"]
    assert props["title"] == {"type": "string"}
    assert create_page.spec().description == ""


def test_recursive_models_keep_their_defs() -> None:
    class Node(BaseModel):
        name: str
        children: list[Node] = []

    Node.model_rebuild()

    @tool
    def plant(tree: Node) -> int:
        return 1

    params = plant.spec().parameters
    assert "Node" in params["$defs"]
    assert params["properties"]["tree"] == {"$ref": "#/$defs/Node"}
    assert not [path for path, _ in _walk(params) if path[-1] == "title"]


def test_field_constraints_and_annotated_descriptions() -> None:
    @tool
    def search(
        query: Annotated[str, Field(description="Words to look for.", min_length=1)],
        limit: int = Field(10, ge=1, le=100),
        color: Color = Color.RED,
    ) -> list[str]:
        """Search the catalogue.

        Args:
            query: Ignored, the Annotated description wins.
            limit: At most this many hits.
        """
        return []

    props = search.spec().parameters["properties"]
    assert props["query"]["description"] == "Words to look for."
    assert props["query"]["minLength"] == 1
    assert props["limit"] == {
        "type": "integer",
        "default": 10,
        "minimum": 1,
        "maximum": 100,
        "description": "At most this many hits.",
    }
    assert props["color"]["enum"] == ["red", "blue"]
    assert search.validate({"query": "x", "color": "blue"}) == {
        "query": "x",
        "limit": 10,
        "color": Color.BLUE,
    }
    with pytest.raises(ms.ToolInputError, match=r"argument 'limit' must be less than or equal"):
        search.validate({"query": "x", "limit": 1000})


def test_argument_names_that_shadow_pydantic_attributes_work() -> None:
    @tool
    def store(json: str, copy: bool = False, schema: str = "s", model_config: int = 0) -> str:
        return json

    assert set(store.spec().parameters["properties"]) == {"json", "copy", "schema", "model_config"}
    assert store.validate({"json": "x"}) == {
        "json": "x",
        "copy": False,
        "schema": "s",
        "model_config": 0,
    }


def test_docstring_sections() -> None:
    description, args = parse_docstring(
        """Do a thing.

        Second paragraph,
        wrapped.

        Args:
            a (int): First
                argument.
            *rest: Ignored star.

        Raises:
            ValueError: never an argument.
        """
    )
    assert description == "Do a thing.\n\nSecond paragraph, wrapped."
    assert args == {"a": "First argument.", "rest": "Ignored star."}
    assert parse_docstring(None) == ("", {})


# -- parsing and validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"to": "a@b.c", "subject": "hi"}', {"to": "a@b.c", "subject": "hi"}),
        ('```json\n{"to": "a@b.c"}\n```', {"to": "a@b.c"}),
        ('```\n{"to": "a@b.c"}\n```', {"to": "a@b.c"}),
        ('Sure! I will call it with:\n```json\n{"to": "x"}\n```\nDone.', {"to": "x"}),
        ('Calling send_email with {"to": "x", "cc": ["y"]} now.', {"to": "x", "cc": ["y"]}),
        ('I think {not json} but {"to": "x"} works', {"to": "x"}),
        ('"{\\"to\\": \\"x\\"}"', {"to": "x"}),  # encoded twice
        ('{"body": "two\nlines"}', {"body": "two\nlines"}),  # a raw newline inside a string
        ("", {}),
        ("   ", {}),
        ("null", {}),
        ({"to": "x"}, {"to": "x"}),
    ],
)
def test_parse_arguments_is_tolerant(raw: str | dict[str, Any], expected: dict[str, Any]) -> None:
    assert send_email.parse_arguments(raw) == expected


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{to: 'x'}", "arguments are not valid JSON (Expecting property name"),
        ("sorry, I cannot", "arguments are not valid JSON (Expecting value at line 1 column 1)"),
        (
            '["x", "y"]',
            "arguments must be a JSON object with one key per argument, got a JSON array",
        ),
        ("42", "got a JSON number 42"),
    ],
)
def test_unreadable_arguments_say_why_and_what_was_expected(raw: str, why: str) -> None:
    with pytest.raises(ms.ToolInputError) as info:
        send_email.parse_arguments(raw)
    message = str(info.value)
    assert message.startswith("send_email: ")
    assert why in message
    assert message.endswith(
        'Expected: send_email(to: string, subject: string, body: string = "", urgency: '
        '"low"|"normal"|"high" = "normal", cc: list[string]|null = null, address: '
        "object|null = null, items: list[object] = [])"
    )


def test_validation_lists_each_problem_for_the_model() -> None:
    @tool
    def send_email(to: str, count: int = 1) -> None:
        """Send."""

    with pytest.raises(ms.ToolInputError) as info:
        send_email.validate({"count": "three", "cc": "x"})
    first, expected = str(info.value).split("\n")
    assert first == (
        "send_email: argument 'to' is required; argument 'count' must be an integer "
        "(got 'three'); unexpected argument 'cc'"
    )
    assert expected == "Expected: send_email(to: string, count: integer = 1)"


def test_validation_messages_for_nested_values_enums_and_unions() -> None:
    @tool
    def ship(
        address: Address,
        items: list[LineItem],
        urgency: Literal["low", "high"] = "low",
        ref: int | str = 0,
        express: bool = False,
    ) -> None:
        pass

    with pytest.raises(ms.ToolInputError) as info:
        ship.validate(
            {
                "address": {"street": 5},
                "items": [{"sku": "a"}, {"qty": "many"}],
                "urgency": "asap",
                "ref": [1],
                "express": "maybe",
            }
        )
    problems = str(info.value).split("\n")[0].removeprefix("ship: ").split("; ")
    assert problems == [
        "argument 'address.street' must be a string (got 5)",
        "argument 'address.city' is required",
        "argument 'items[1].sku' is required",
        "argument 'items[1].qty' must be an integer (got 'many')",
        "argument 'urgency' must be one of 'low' or 'high' (got 'asap')",
        "argument 'ref' must be an integer or a string (got [1])",
        "argument 'express' must be a boolean (true or false) (got 'maybe')",
    ]


def test_validation_coerces_and_fills_defaults() -> None:
    args = send_email.prepare('{"to": "a@b.c", "subject": "s", "address": {"street": "1 Main",'
                              ' "city": "X"}, "items": [{"sku": "k", "qty": "2"}]}')  # fmt: skip
    assert args == {
        "to": "a@b.c",
        "subject": "s",
        "body": "",
        "urgency": "normal",
        "cc": None,
        "address": Address(street="1 Main", city="X"),
        "items": [LineItem(sku="k", qty=2)],
    }
    with pytest.raises(ms.ToolInputError, match="arguments must be a JSON object"):
        send_email.validate(["to"])  # type: ignore[arg-type]


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["send email", "", "x" * 65, "émoji", "a.b", "<lambda>"])
def test_bad_names_fail_at_decoration(name: str) -> None:
    with pytest.raises(ms.ConfigError, match="is not allowed: use 1 to 64 letters"):
        tool(name=name)(lambda: None)


def test_names_default_to_the_function_and_can_be_chosen() -> None:
    assert tool(name="x" * 64)(lambda: None).name == "x" * 64
    assert tool(lambda: None, name="anon").name == "anon"  # type: ignore[call-overload]
    with pytest.raises(ms.ConfigError, match="'<lambda>' is not allowed"):
        tool(lambda: None)


@pytest.mark.parametrize(
    ("effect", "timeout", "approval", "mode"),
    [
        ("read", 30.0, False, "at_least_once"),
        ("write", 60.0, False, "at_least_once"),
        ("irreversible", 120.0, True, "at_most_once"),
    ],
)
def test_defaults_by_effect(effect: Effect, timeout: float, approval: bool, mode: str) -> None:
    t = tool(name="t", effect=effect)(_noop)
    assert (t.timeout_s, t.requires_approval, t.mode, t.effect) == (timeout, approval, mode, effect)


def test_explicit_options_win_over_effect_defaults() -> None:
    t = tool(name="pay", effect="irreversible", timeout_s=5, requires_approval=False)(_noop)
    assert (t.timeout_s, t.requires_approval) == (5.0, False)
    assert tool(name="r", requires_approval=True)(_noop).requires_approval is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"effect": "delete"}, "effect must be one of"),
        ({"timeout_s": 0}, "timeout_s must be a finite number > 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be a finite number > 0"),
        ({"max_result_chars": 10}, "max_result_chars must be an int >= 64"),
        ({"retry": 3}, "retry must be a RetryPolicy"),
        ({"validators": [42]}, "validator 42 is not callable"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ms.ConfigError, match=message):
        tool(name="t", **options)(_noop)


def test_signatures_without_a_schema_fail_at_decoration() -> None:
    def star(*names: str) -> None: ...

    def positional(a: int, /) -> None: ...

    class Opaque:
        pass

    def opaque(thing: Opaque) -> None: ...

    with pytest.raises(ms.ConfigError, match="'names' is \\*args or \\*\\*kwargs"):
        tool(star)
    with pytest.raises(ms.ConfigError, match="'a' is positional-only"):
        tool(positional)
    with pytest.raises(ms.ConfigError, match="its arguments have no JSON schema"):
        tool(opaque)
    with pytest.raises(ms.ConfigError, match="is already a tool"):
        tool(send_email)


def test_step_functions_match_the_tool() -> None:
    async def fetch(url: str) -> str:
        return url

    afetch = tool(fetch)
    assert afetch.is_async and asyncio.iscoroutinefunction(afetch.step_function)
    assert not send_email.is_async
    assert not asyncio.iscoroutinefunction(send_email.step_function)
    assert send_email.step_function.__qualname__ == "tool:send_email" == send_email.step_name
    assert afetch.step_function is afetch.step_function  # one function: ctx.step caches it
    assert asyncio.run(afetch("u")) == "u"  # calling the Tool calls the function


def test_a_tool_that_needs_a_context_refuses_to_run_outside_a_step() -> None:
    with pytest.raises(ms.ConfigError, match="takes a ToolContext, so it must run as a step"):
        send_email.step_function({"to": "x", "subject": "s"})
    plain = tool(name="plain")(lambda a: a * 2)
    assert plain.step_function({"a": 2}) == 4 == plain.step_function(a=2)


# -- running in a workflow ---------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> Iterator[ms.App]:
    application = ms.App(f"sqlite:///{tmp_path / 't.db'}", poll_interval_s=0.01)
    yield application
    application.close()


async def test_a_tool_runs_as_a_journaled_step_with_its_idempotency_key(app: ms.App) -> None:
    seen: list[ToolContext] = []

    @tool(effect="write")
    def send(to: str, count: int = 1, *, ctx: ToolContext) -> dict[str, Any]:
        seen.append(ctx)
        return {"sent": count, "key": ctx.idempotency_key}

    @app.workflow
    async def mail(ctx: ms.RunContext, raw: str) -> dict[str, Any]:
        await ctx.step(lambda: None, name="before")
        return await ctx.step(send.step_function, **send.validate(send.parse_arguments(raw)))

    result = await app.run(mail, '```json\n{"to": "ann", "count": "2"}\n```')
    (run,) = app.list_runs()
    assert result == {"sent": 2, "key": f"{run.id}:0:1"}
    assert seen == [
        ToolContext(
            run_id=run.id,
            session=0,
            seq=1,
            attempt=1,
            idempotency_key=f"{run.id}:0:1",
            tool="send",
            effect="write",
        )
    ]
    assert [s.name for s in app.observe.steps(run.id)] == ["before", "tool:send"]


async def test_tool_run_passes_arguments_whatever_their_names(app: ms.App) -> None:
    # `name`, `timeout`, `retry` and `mode` are also ctx.step's own keywords: Tool.run
    # passes the arguments as one mapping, so they still reach the tool.
    @tool
    async def rename(name: str, timeout: int, mode: str, *, ctx: ToolContext) -> str:
        return f"{name}/{timeout}/{mode}/{ctx.tool}/{ctx.attempt}"

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        args = rename.prepare({"name": "n", "timeout": "3", "mode": "m"})
        value: str = await rename.run(ctx, args)
        return value

    assert await app.run(wf) == "n/3/m/rename/1"


async def test_a_hung_tool_times_out_and_the_model_is_told(app: ms.App) -> None:
    @tool(timeout_s=0.05, retry=ms.RetryPolicy.never())
    async def hang() -> None:
        await asyncio.sleep(30)

    @app.workflow
    async def wf(ctx: ms.RunContext) -> str:
        try:
            await hang.run(ctx, {})
        except ms.StepFailed as exc:
            return hang.render_error(exc)
        return "finished"

    told = await app.run(wf)
    assert told.startswith("StepTimeout: the tool ran past its time limit")
    assert "0.05s" in told


async def test_failing_validators_fail_the_step_with_validation_failed(app: ms.App) -> None:
    def non_empty(result: list[str]) -> str | None:
        return None if result else "the result is empty"

    @tool(validators=[non_empty])
    def lookup(q: str) -> list[str]:
        return []

    @app.workflow
    async def wf(ctx: ms.RunContext) -> list[Any]:
        try:
            await lookup.run(ctx, lookup.prepare({"q": "x"}))
        except ms.StepFailed as exc:
            return [exc.error_type, exc.attempts, lookup.render_error(exc)]
        return ["passed"]

    assert await app.run(wf) == [
        "mainspring._errors.ValidationFailed",
        1,  # not retryable: a repeat would fail the same way
        "ValidationFailed: lookup: result failed validator 'non_empty': the result is empty",
    ]


def test_validators_name_the_tool_and_the_rule() -> None:
    def positive(result: int) -> None:
        if result <= 0:
            raise ms.ValidationFailed(f"{result!r} is not positive")

    def small(result: int) -> bool:
        return result < 10

    t = tool(name="count", validators=[positive, small])(lambda: 0)
    t.check_result(5)
    with pytest.raises(ms.ValidationFailed, match=r"^count: result failed validator 'positive': "):
        t.check_result(-1)
    with pytest.raises(ms.ValidationFailed, match="validator 'small': it returned False"):
        t.check_result(11)
    with pytest.raises(ms.ValidationFailed, match="validator 'positive': 0 is not positive"):
        t.step_function()


# -- results -----------------------------------------------------------------------------------


def test_a_ten_megabyte_result_is_truncated_with_a_marker() -> None:
    text = send_email.render_result("x" * 10_000_000)
    assert len(text) <= send_email.max_result_chars == 4000
    kept = text.index("…")
    assert text[:kept] == "x" * kept
    assert text[kept:] == f"…[truncated {10_000_000 - kept:,} of 10,000,000 chars]"

    rows = [{"id": i, "text": "lorem ipsum"} for i in range(300_000)]
    text = tool(name="rows", max_result_chars=200)(_noop).render_result(rows)
    assert len(text) <= 200
    assert text.startswith('[{"id":0,"text":"lorem ipsum"},{"id":1,')
    assert text.endswith(" chars]")


def test_small_results_are_compact_json() -> None:
    assert send_email.render_result({"a": [1, 2], "b": None}) == '{"a":[1,2],"b":null}'
    assert send_email.render_result(Address(street="s", city="c")) == (
        '{"street":"s","city":"c","zip":null}'
    )
    assert send_email.render_result("plain text") == "plain text"
    assert send_email.render_result(object()).startswith("<object object")


def test_errors_are_short_for_the_model() -> None:
    assert send_email.render_error(ValueError("no ticket 42")) == "ValueError: no ticket 42"
    assert send_email.render_error(KeyError()) == "KeyError"
    error = ms.ToolInputError("bad", run_id="r1", step="0:1 'x'")
    assert send_email.render_error(error) == "ToolInputError: bad"
    assert len(send_email.render_error(RuntimeError("x" * 10_000))) <= 1000
    failed = ms.StepFailed(
        "step 'tool:x' failed after 3 attempt(s): ConnectionError: reset by peer",
        error_type="builtins.ConnectionError",
        attempts=3,
    )
    assert send_email.render_error(failed) == "ConnectionError: reset by peer"


# -- registry ----------------------------------------------------------------------------------


def _registry() -> ToolRegistry:
    @tool
    def lookup_ticket(id: int) -> str:
        return ""

    @tool(effect="irreversible")
    def refund(order: str) -> None:
        pass

    return ToolRegistry([send_email, lookup_ticket, refund])


def test_registry_resolves_and_enforces_allowlists() -> None:
    reg = _registry()
    assert reg.names == ["lookup_ticket", "refund", "send_email"]
    assert len(reg) == 3 and "refund" in reg and reg.get("nope") is None
    assert reg.resolve("refund").name == "refund"
    assert reg.resolve("refund", allowed=["refund"]).name == "refund"
    assert [s.name for s in reg.specs(["send_email", "refund"])] == ["send_email", "refund"]
    with pytest.raises(ms.ToolNotAllowed) as info:
        reg.resolve("refund", allowed={"lookup_ticket", "send_email"})
    assert str(info.value) == (
        "tool 'refund' exists but is not on this agent's allowlist "
        "(allowed: lookup_ticket, send_email)"
    )


def test_unknown_tools_list_what_exists() -> None:
    reg = _registry()
    with pytest.raises(ms.UnknownTool) as info:
        reg.resolve("lookup_tickets")
    assert str(info.value) == (
        "no tool named 'lookup_tickets'; did you mean 'lookup_ticket'? "
        "(tools that exist: lookup_ticket, refund, send_email)"
    )
    with pytest.raises(ms.UnknownTool) as info:
        reg.resolve("delete_all", allowed=["send_email"])
    assert str(info.value) == (
        "no tool named 'delete_all' (tools that exist: lookup_ticket, refund, send_email; "
        "this agent may use: send_email)"
    )
    with pytest.raises(ms.ConfigError, match=r"not registered: \['nope'\]"):
        reg.specs(["send_email", "nope"])


def test_duplicate_names_are_a_config_error() -> None:
    reg = _registry()
    reg.add(send_email)  # the same tool again is harmless
    with pytest.raises(ms.ConfigError, match="two tools are named 'refund'"):
        reg.add(tool(name="refund")(_noop))
    with pytest.raises(ms.ConfigError, match="only tools can be registered"):
        reg.add(print)  # type: ignore[arg-type]


def test_public_names_are_pinned() -> None:
    # What users import from mainspring.tools; the rest reach them as mainspring.tool,
    # mainspring.ToolContext, ... (the floors above import them from __internal__).
    assert set(mainspring.tools.__all__) == {
        "Tool", "ToolRegistry", "tool_of", "Toolset", "ToolList", "MCPTool",
        "MCPToolError", "effect_of", "IDEMPOTENCY_META_KEY", "mark_step_effect",
        "step_effect",
    }  # fmt: skip
    assert set(mainspring.tools.__internal__) == {
        "Effect", "OutputSchema", "ToolContext", "ToolDeps", "Validator", "tool",
        "describe_errors", "parse_arguments", "MCPToolset",
    }  # fmt: skip
    for name in ("tool", "ToolContext", "Effect"):
        assert getattr(mainspring, name) is getattr(mainspring.tools, name)
    assert isinstance(send_email, Tool)
