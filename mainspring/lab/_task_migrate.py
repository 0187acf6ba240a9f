"""The ``migrate`` task: records through ``validate`` → ``write`` (an idempotent write),
with a ``checkpoint`` a reviewer approves after every few writes."""

from __future__ import annotations

from typing import Any

from ._task_spec import PROGRESS, TaskSpec, TaskWorld, ToolDef, int_args

__all__ = ["MIGRATE", "MigrateWorld"]

MIGRATE = TaskSpec(
    "migrate",
    "Migrate every record of the batch: validate it, then write it; after every "
    "few writes ask a reviewer to approve a checkpoint. Call finish when done.",
    (
        PROGRESS,
        ToolDef("validate", "Validate one record.", int_args("record")),
        ToolDef("write", "Write one validated record to the new store.", int_args("record")),
        ToolDef(
            "checkpoint", "Ask a reviewer to approve the writes so far.", int_args("upto"), True
        ),
    ),
    calls_per_item=2.2,
    gate_every=5,
)


class MigrateWorld(TaskWorld):
    spec = MIGRATE

    def _checkpoints(self, label: str) -> int:
        row = self.conn().execute("SELECT checkpoints FROM runs WHERE label = ?", (label,))
        return int(row.fetchone()[0])

    def next(self, label: str) -> dict[str, Any]:
        rows = self.states(label)
        written = sum(s == "written" for _, s in rows)
        if written // MIGRATE.gate_every > self._checkpoints(label):
            return {"action": "checkpoint", "upto": written}
        for idx, state in rows:
            if state == "new":
                return {"action": "validate", "record": idx}
            if state == "validated":
                return {"action": "write", "record": idx}
        return {"action": "finish"}

    def check(self, label: str, items: int) -> list[str]:
        problems = self.unfinished(label, items, "written", "write", items)
        checkpoints, want = self._checkpoints(label), items // MIGRATE.gate_every
        if checkpoints < want:
            problems.append(f"{label}: {checkpoints} checkpoints approved, expected {want}")
        return problems

    def duplicates(self, label: str) -> int:
        return self.repeated(label, "write")

    def apply(self, label: str, tool: str, args: dict[str, Any], key: str) -> dict[str, Any]:
        if tool == "progress":
            return {"ok": True}
        if tool == "checkpoint":
            self.conn().execute(
                "UPDATE runs SET checkpoints = MAX(checkpoints, ? / ?) WHERE label = ?",
                (int(args["upto"]), MIGRATE.gate_every, label),
            )
            return {"ok": True, "approved_upto": args["upto"]}
        idx = int(args["record"])
        state = self.state(label, idx)
        if state is None:
            return {"ok": False, "error": f"no item {idx}"}
        want = "new" if tool == "validate" else "validated"
        if state != want:
            return {"ok": False, "error": f"{tool} {idx}: item is {state}"}
        if tool == "validate":
            self.set_state(label, idx, "validated")
        elif self.next(label)["action"] == "checkpoint":
            return {"ok": False, "error": "a checkpoint is due before more writes"}
        else:  # an idempotent API: once per key, atomically with the state
            self.ledger.apply(
                key,
                "write",
                {"label": label, "item": idx},
                on_apply=lambda c: c.execute(
                    "UPDATE items SET state = 'written' WHERE label = ? AND idx = ?", (label, idx)
                ),
            )
        # needs_refund is support's field; kept so that the result, and so the tokens,
        # stay as the first slice measured them.
        return {"ok": True, tool: idx, "needs_refund": idx % 5 == 2}
