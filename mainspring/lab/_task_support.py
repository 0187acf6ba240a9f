"""The ``support`` task: open each ticket of a queue, refund one in five (irreversible,
behind a reviewer's approval, no deduplication by the outside world), close it."""

from __future__ import annotations

from typing import Any

from ._task_spec import PROGRESS, TaskSpec, TaskWorld, ToolDef, int_args

__all__ = ["SUPPORT", "SupportWorld", "needs_refund"]

SUPPORT = TaskSpec(
    "support",
    "Work the ticket queue in order: open each ticket, refund it if it needs a "
    "refund (a reviewer approves each refund), then close it. Call finish when done.",
    (
        PROGRESS,
        ToolDef("open_ticket", "Open a ticket and read it.", int_args("ticket")),
        ToolDef("refund", "Refund a ticket (irreversible).", int_args("ticket"), True, True),
        ToolDef("close_ticket", "Close a ticket.", int_args("ticket")),
    ),
    calls_per_item=2.2,
)


def needs_refund(ticket: int) -> bool:
    return ticket % 5 == 2


_BEFORE = {"open_ticket": ("new",), "refund": ("opened",), "close_ticket": ("opened", "refunded")}
_AFTER = {"open_ticket": "opened", "refund": "refunded", "close_ticket": "closed"}


class SupportWorld(TaskWorld):
    spec = SUPPORT

    def next(self, label: str) -> dict[str, Any]:
        for idx, state in self.states(label):
            if state == "new":
                return {"action": "open_ticket", "ticket": idx}
            if state == "opened" and needs_refund(idx):
                return {"action": "refund", "ticket": idx}
            if state in ("opened", "refunded"):
                return {"action": "close_ticket", "ticket": idx}
        return {"action": "finish"}

    def check(self, label: str, items: int) -> list[str]:
        refunds = sum(needs_refund(i) for i in range(items))
        return self.unfinished(label, items, "closed", "refund", refunds)

    def duplicates(self, label: str) -> int:
        return self.repeated(label, "refund")

    def apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        if tool == "progress":
            return {"ok": True}
        idx = int(args["ticket"])
        state = self.state(label, idx)
        if state is None:
            return {"ok": False, "error": f"no item {idx}"}
        if state not in _BEFORE[tool]:
            return {"ok": False, "error": f"{tool} {idx}: item is {state}"}
        if tool == "refund" and not needs_refund(idx):
            return {"ok": False, "error": f"ticket {idx} needs no refund"}
        if tool == "close_ticket" and state == "opened" and needs_refund(idx):
            return {"ok": False, "error": f"ticket {idx} needs its refund before closing"}
        if tool == "refund":  # no deduplication: a second refund is a second refund
            self.ledger.apply_unsafe(
                f"refund:{label}:{idx}", "refund", {"label": label, "item": idx}
            )
        self.set_state(label, idx, _AFTER[tool])
        return {"ok": True, tool: idx, "needs_refund": needs_refund(idx)}
