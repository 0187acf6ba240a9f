"""Whose word decides an MCP tool's effect class: a real MCP server over stdio
(tests/apps/mcp_bank.py) whose money-moving tools claim to be read-only, claim to be
read-only and destructive at once, or claim nothing. An untrusted server (the
default) gets a person's approval on every call; a trusted one is read as MCP
defines its hints, contradictions at their most dangerous; ``effects=`` overrides
either. No transfer happens without an approval."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from _mcp import ROOT, app

import mainspring as ms
from mainspring.testing import ScriptedModel
from mainspring.tools import MCPToolset, effect_of

__all__ = ["app"]  # fixture
BANK = ROOT / "tests" / "apps" / "mcp_bank.py"
MOVES = ("sneaky_transfer", "plain_transfer", "liar_transfer", "honest_transfer")
call = ScriptedModel.call


def _bank(app: ms.App, ledger: Path, name: str = "bank", **options: Any) -> MCPToolset:
    return app.mcp.add(name, command=[sys.executable, str(BANK), str(ledger)], **options)


def _moved(ledger: Path) -> str:
    """The transfers the server made."""
    return ledger.read_text() if ledger.exists() else ""


async def _effects(bank: MCPToolset) -> dict[str, tuple[str, bool, str]]:
    listing = bank.tools_from((await bank.connect()).tools)
    return {
        t.name: (t.effect, t.requires_approval, t.mode)  # type: ignore[attr-defined]
        for t in listing.tools
    }


async def _asked(app: ms.App, bank: MCPToolset, ledger: Path) -> list[str]:
    """Run an agent that calls every tool once; reject each approval it asks for.
    The tools the agent had to ask a person for, in order."""
    model = ScriptedModel(
        [
            call("balance", {}),
            *(call(name, {"to": "mallory", "cents": 50_000}) for name in MOVES),
            call("finish", {"answer": "tried"}),
        ]
    )
    agent = app.agent("payer", model=model, instructions="Pay.", tools=[bank])
    run = app.submit(agent, "Pay mallory")
    asked = []
    for _ in range(10):
        await app.worker().run(until_idle=True)
        pending = app.requests(run.run_id)
        if not pending:
            break
        (request,) = pending
        asked.append(request.preview["tool"])
        assert _moved(ledger) == ""  # nothing moved before the approval
        app.answer(run.run_id, request.id, decision="reject", reason="no", by="reviewer")
    assert (await run.result()).answer == "tried"
    return asked


async def test_an_untrusted_server_gets_an_approval_on_every_call(
    app: ms.App, tmp_path: Path
) -> None:
    ledger = tmp_path / "moves.txt"
    bank = _bank(app, ledger)  # trust_annotations=False: the default
    assert await _effects(bank) == {
        name: ("irreversible", True, "at_most_once") for name in ("balance", *MOVES)
    }
    assert await _asked(app, bank, ledger) == ["balance", *MOVES]
    assert _moved(ledger) == ""  # every transfer was rejected, none happened


async def test_a_trusted_server_is_read_at_its_most_dangerous(app: ms.App, tmp_path: Path) -> None:
    ledger = tmp_path / "moves.txt"
    bank = _bank(app, ledger, trust_annotations=True)
    assert await _effects(bank) == {
        "balance": ("read", False, "at_least_once"),  # honestly read-only
        "sneaky_transfer": ("irreversible", True, "at_most_once"),  # both: the worse
        "plain_transfer": ("irreversible", True, "at_most_once"),  # none: MCP's default
        "liar_transfer": ("read", False, "at_least_once"),  # trusted, so believed
        "honest_transfer": ("irreversible", True, "at_most_once"),
    }
    # The app's word beats the server's, trusted or not.
    told = _bank(app, ledger, name="told", effects={"balance": "read"})
    effects = await _effects(told)
    assert effects["balance"] == ("read", False, "at_least_once")
    assert effects["liar_transfer"] == ("irreversible", True, "at_most_once")


async def test_trusted_annotations_end_to_end(app: ms.App, tmp_path: Path) -> None:
    ledger = tmp_path / "moves.txt"
    bank = _bank(app, ledger, trust_annotations=True, effects={"liar_transfer": "irreversible"})
    assert await _asked(app, bank, ledger) == list(MOVES)  # balance ran without asking
    assert _moved(ledger) == ""


@pytest.mark.parametrize(
    ("annotations", "trusted", "effect"),
    [
        (None, True, "irreversible"),
        ({}, True, "irreversible"),
        ({"readOnlyHint": True}, True, "read"),
        ({"readOnlyHint": True, "destructiveHint": True}, True, "irreversible"),
        ({"readOnlyHint": True, "destructiveHint": "no"}, True, "irreversible"),
        ({"readOnlyHint": "true"}, True, "irreversible"),  # not a boolean: not believed
        ({"readOnlyHint": False, "destructiveHint": False}, True, "write"),
        ({"destructiveHint": False, "idempotentHint": True}, True, "write"),
        ({"readOnlyHint": True}, False, "irreversible"),
        ({"destructiveHint": False}, False, "irreversible"),
    ],
)
def test_effect_of(annotations: dict[str, Any] | None, trusted: bool, effect: str) -> None:
    assert effect_of(annotations, trusted=trusted) == effect
    assert effect_of(annotations) == "irreversible"  # untrusted unless said


def test_trust_must_be_a_boolean(app: ms.App) -> None:
    with pytest.raises(ms.ConfigError, match="trust_annotations must be True or False"):
        app.mcp.add("odd", command=["x"], trust_annotations="yes")  # type: ignore[arg-type]
