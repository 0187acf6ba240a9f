"""The horizon suite's reconcile and research tasks and its HTML report: each world's
clean path ends exact, the audit catches a duplicate post, a duplicate note and a lost
handoff, the erring policy still converges, real workers run a short cell of each,
and the report is one page with one SVG per plot."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mainspring.cli import cli
from mainspring.lab import TASKS, PolicyRates, SuiteCell, SuiteWorld, decide, suite_html
from mainspring.lab._task_reconcile import entry_amounts
from mainspring.lab._task_research import fact_text

_CLEAN = PolicyRates(malformed=0, wrong_tool=0, repeat=0, forget=0)


def _play(world: SuiteWorld, task: str, label: str, rates: PolicyRates, seed: int = 5) -> int:
    """A plain loop: decide() plays the model, world.call the tools; the errors made."""
    rng = random.Random(seed)
    last_result: str | None = None
    last_call: tuple[str, str] | None = None
    errors = 0
    for turn in range(3000):
        tool, arguments, error = decide(TASKS[task], last_result, last_call, rng, rates)
        errors += error is not None
        if tool == "finish":
            return errors
        try:
            parsed = json.loads(arguments)
        except ValueError:
            last_result = "repair: the arguments are not JSON"
            continue
        last_call = (tool, arguments)
        last_result = json.dumps(world.call(label, tool, parsed, f"{label}:{turn}"))
    raise AssertionError(f"{task} did not finish in 3,000 turns")


def test_reconcile_clean_path_makes_the_ledgers_agree_with_one_post_per_difference(
    tmp_path: Path,
) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("reconcile", "r1", 60)
    differences = [i for i in range(60) if (entry_amounts(i)[0] or 0) != (entry_amounts(i)[1] or 0)]
    kinds = {(a is None, b is None) for a, b in map(entry_amounts, differences)}
    assert kinds == {(False, False), (True, False), (False, True)}  # every kind is seeded
    assert _play(world, "reconcile", "r1", _CLEAN) == 0
    assert world.check("r1") == []
    assert world.duplicate_effects() == 0
    posts = world.ledger.calls_by_key("post")
    assert len(posts) == len(differences)
    assert world.next("r1") == {"action": "finish"}
    world.close()


def test_reconcile_counts_a_post_reissued_with_a_new_key(tmp_path: Path) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("reconcile", "r1", 30)
    assert world.call("r1", "compare", {"first": 0, "last": 9}, "k0")["differences"] == []
    first = world.call("r1", "compare", {"first": 10, "last": 19}, "k0b")
    assert [d["entry"] for d in first["differences"]] == [13, 16, 17]  # seeded, every run
    todo = first["next"]
    assert todo["action"] == "post"
    args = {"entry": todo["entry"], "amount": todo["amount"]}
    assert world.call("r1", "post", args, "k1")["replayed"] is False
    # The same key again is deduplicated by the posting API ...
    assert world.call("r1", "post", args, "k1")["replayed"] is True
    assert world.duplicate_effects() == 0
    # ... a new key adjusts twice: a duplicate effect, and B is off again.
    again = world.call("r1", "post", args, "k2")
    assert again["ok"] and world.duplicate_effects("r1") == 1
    assert again["next"] == {"action": "post", "entry": args["entry"], "amount": -args["amount"]}
    world.call("r1", "post", {"entry": args["entry"], "amount": -args["amount"]}, "k3")
    assert world.duplicate_effects("r1") == 1  # the correction is no duplicate
    problems = world.check("r1")
    assert any("1 duplicate post" in p for p in problems), problems
    _play(world, "reconcile", "r1", _CLEAN)
    # The ledgers agree in the end, but the audit still lists the duplicate post.
    assert [p for p in world.check("r1") if "difference" in p] == []
    assert any("duplicate post" in p for p in world.check("r1"))
    world.close()


def test_research_clean_path_notes_every_fact_once_across_sessions(tmp_path: Path) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("research", "q1", 10)
    seen: list[dict[str, object]] = []
    result = world.call("q1", "progress", {}, "p")
    while result["next"]["action"] != "finish":  # type: ignore[index]
        todo = dict(result["next"])  # type: ignore[arg-type]
        seen.append(dict(todo))
        tool = str(todo.pop("action"))
        result = world.call("q1", tool, todo, f"q1:{len(seen)}")
        assert result["ok"], result
    actions = [str(s["action"]) for s in seen]
    # 10 facts, 8 searches and reads a session: three sessions, two resumed.
    assert actions.count("handoff") == 3 and actions.count("resume") == 3
    assert actions.count("search") == actions.count("read") == 10
    assert actions[-1] == "report"
    resumed = [s for s in seen if s["action"] == "resume"]
    assert [s["session"] for s in resumed] == [2, 3, 4]
    assert world.check("q1") == []
    assert world.duplicate_effects() == 0
    world.close()


@pytest.mark.parametrize("task", ["reconcile", "research"])
def test_every_result_of_a_1000_step_run_fits_a_tool_result(task: str, tmp_path: Path) -> None:
    # mainspring cuts a tool result at 4,000 characters by default, and a cut result
    # hides its "next": no result may grow with N.
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run(task, "b1", TASKS[task].items(1000))
    result = world.call("b1", "progress", {}, "p")
    calls = 0
    while result["next"]["action"] != "finish":
        todo = dict(result["next"])
        calls += 1
        result = world.call("b1", str(todo.pop("action")), todo, f"k{calls}")
        assert result["ok"] and len(json.dumps(result)) < 4000, result
    assert 900 <= calls <= 1100  # about one call a step
    assert world.check("b1") == []
    world.close()


def test_research_audit_catches_a_lost_handoff_and_a_fact_noted_twice(tmp_path: Path) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("research", "q1", 3)
    for fact in range(3):
        assert world.call("q1", "search", {"fact": fact}, f"s{fact}")["ok"]
        read = world.call("q1", "read", {"source": 2 * fact + 1}, f"r{fact}")
        assert read["text"] == fact_text(fact)
    # The notes of the session lose fact 2: it is lost across the handoff.
    notes = "; ".join(fact_text(f) for f in (0, 1))
    handed = world.call("q1", "handoff", {"notes": notes}, "h1")
    assert handed["noted"] == 2 and handed["next"] == {"action": "resume", "session": 2}
    assert (
        world.check("q1")[0]
        == "q1: fact 2 lost across a handoff (read in session 1, not in its notes)"
    )
    # The same handoff with a new key notes facts 0 and 1 again.
    world.call("q1", "handoff", {"notes": notes}, "h2")
    assert world.duplicate_effects("q1") == 2
    problems = world.check("q1")
    assert "q1: fact 0 recorded 2 times" in problems and "q1: fact 1 recorded 2 times" in problems
    # The world still leads to the end (fact 2 gathered again), but the audit stands.
    _play(world, "research", "q1", _CLEAN)
    problems = world.check("q1")
    assert len(problems) == 3 and not any("never noted" in p or "report" in p for p in problems)
    world.close()


def test_research_a_session_abandoned_without_handoff_loses_its_facts(tmp_path: Path) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("research", "q1", 4)
    world.call("q1", "search", {"fact": 0}, "s0")
    world.call("q1", "read", {"source": 1}, "r0")
    started = world.call("q1", "resume", {"session": 2}, "x")  # no handoff first
    assert started["ok"] and (started["noted"], started["latest"]) == (0, "")
    assert any("fact 0 lost" in p for p in world.check("q1"))
    world.close()


def test_research_forget_acts_as_if_the_notes_were_missing_and_is_refused(
    tmp_path: Path,
) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run("research", "q1", 12)
    result = world.call("q1", "progress", {}, "p")
    turn = 0
    while result["next"] != {"action": "resume", "session": 2}:
        todo = dict(result["next"])
        turn += 1
        result = world.call("q1", str(todo.pop("action")), todo, f"k{turn}")
    result = world.call("q1", "resume", {"session": 2}, "k-resume")
    assert result["noted"] == 4
    assert result["latest"] == "; ".join(fact_text(f) for f in range(4))
    assert result["next"] == {"action": "search", "fact": 4}
    forget = PolicyRates(malformed=0, wrong_tool=0, repeat=0, forget=1.0)
    tool, arguments, error = decide(
        TASKS["research"], json.dumps(result), None, random.Random(1), forget
    )
    assert (tool, error) == ("search", "forget") and json.loads(arguments)["fact"] < 4
    refused = world.call("q1", tool, json.loads(arguments), "k-forget")
    assert refused["ok"] is False
    assert "in the notes handed off in session 1" in refused["error"]
    older = world.call("q1", "resume", {"session": 1}, "k-old")
    assert older["ok"] is False and "the next is 3" in older["error"]
    world.close()


def test_policy_never_repeats_or_forgets_a_keyed_call() -> None:
    # A post or a handoff dedups by key only: a second one is a second effect, so
    # the policy's repeat and forget errors never make one (the runtime's must show).
    post = json.dumps({"ok": True, "next": {"action": "post", "entry": 7, "amount": -30}})
    for kind in ("repeat", "forget"):
        rates = PolicyRates(
            **{
                k: 1.0 if k == kind else 0.0
                for k in ("malformed", "wrong_tool", "repeat", "forget")
            }
        )
        made = decide(
            TASKS["reconcile"],
            post,
            ("post", '{"entry": 5, "amount": 12}'),
            random.Random(0),
            rates,
        )
        assert made == ("post", '{"entry": 7, "amount": -30}', None)
    bad = PolicyRates(malformed=1.0, wrong_tool=0, repeat=0, forget=0)
    handoff = json.dumps({"next": {"action": "handoff", "notes": "F1=abcdef"}})
    for seed in range(6):
        tool, arguments, error = decide(TASKS["research"], handoff, None, random.Random(seed), bad)
        assert (tool, error) == ("handoff", "malformed")
        with contextlib.suppress(ValueError):  # or cut-off JSON
            assert not isinstance(json.loads(arguments)["notes"], str)


@pytest.mark.parametrize("task", ["reconcile", "research"])
def test_the_erring_policy_still_converges_on_the_new_tasks(task: str, tmp_path: Path) -> None:
    world = SuiteWorld(tmp_path / "world.db")
    world.add_run(task, "b1", TASKS[task].items(100))
    rates = PolicyRates(malformed=0.1, wrong_tool=0.1, repeat=0.1, forget=0.1)
    assert _play(world, task, "b1", rates) > 10  # errors the policy made
    assert world.check("b1") == []
    assert world.duplicate_effects() == 0
    world.close()


class _Points(HTMLParser):
    """Per <svg>: its data-plot name and how many points (circles) it draws."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: list[list[object]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        found = dict(attrs)
        assert "src" not in found and not str(found.get("href", "")).startswith("http")
        if tag == "svg":
            self.plots.append([found["data-plot"], 0])
        elif tag == "circle":
            self.plots[-1][1] = int(self.plots[-1][1]) + 1  # type: ignore[call-overload]


def test_suite_cells_of_the_new_tasks_under_kills_and_the_html_report(tmp_path: Path) -> None:
    page = tmp_path / "suite.html"
    result = CliRunner().invoke(
        cli,
        [
            "lab",
            "suite",
            "--task",
            "reconcile,research",
            "--steps",
            "10",
            "--runs",
            "2",
            "--kill-every",
            "8",
            "--json",
            "--html",
            str(page),
        ],
    )
    assert result.exit_code == 0, result.output
    cells = json.loads(result.output)["cells"]
    assert [c["task"] for c in cells] == ["reconcile", "research"]
    for cell in cells:
        assert cell["succeeded"] == cell["runs"] == 2, cell["failures"]
        assert cell["duplicate_effects"] == 0
        assert cell["kills"] >= 1
        assert cell["cost_per_success_usd"] == pytest.approx(
            cell["tokens_per_success"] * 0.40 / 1e6
        )
    parsed = _Points()
    parsed.feed(page.read_text())
    assert parsed.plots == [["success", 2], ["tokens", 2]]
    assert "script" not in parsed.tags and "img" not in parsed.tags


def test_report_draws_a_point_per_cell_and_a_line_per_contender_and_task() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class PeerCell(SuiteCell):
        contender: str = "plain-loop"

    def cell(kind: type[SuiteCell], task: str, steps: int, succeeded: int) -> SuiteCell:
        return kind(
            task=task,
            steps=steps,
            items=steps,
            runs=5,
            succeeded=succeeded,
            duplicate_effects=0,
            model_calls=steps * 6,
            tokens=steps * 900,
            kills=0,
            injected={},
            wall_s=1.0,
        )

    cells = [
        cell(k, t, s, 0 if (k is PeerCell and s == 1000) else 5)
        for k in (SuiteCell, PeerCell)
        for t in ("reconcile", "research")
        for s in (10, 100, 1000)
    ]
    page = suite_html(cells)
    parsed = _Points()
    parsed.feed(page)
    # 12 cells; the peer's two 1,000-step cells have no success, so no tokens point.
    assert parsed.plots == [["success", 12], ["tokens", 10]]
    assert page.count("<polyline") == 8  # 4 series (contender · task) per plot
    for name in ("mainspring · reconcile", "plain-loop · research"):
        assert name in page
    assert "<td>plain-loop</td>" in page
