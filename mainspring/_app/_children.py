"""Child runs as the App starts them for a workflow's ``ctx.child`` (the App is the
engine's :class:`~mainspring.journal.ChildStarter`), and how to list them. A part
of :class:`~mainspring.App`."""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError, RunConflict
from .._serde import loads
from ..journal import Workflow
from ..observability import child_traceparent
from ..storage import ParentClose, RunRecord
from ._handle import RunHandle, run_id_of
from ._lineage import new_id
from ._runtime import Part

__all__ = ["Children"]


class Children(Part):
    """Starting and listing an App's child runs."""

    def children(self, run_id: str | RunHandle) -> list[RunRecord]:
        """The child runs ``run_id`` started (``ctx.child``) in the order it started
        them (by journal position), as summaries (no input, output or hand-off)."""
        run_id = run_id_of(run_id)
        found = self._store.list_runs(parent=run_id, limit=10_000, summary=True)
        return sorted((r for r in found if r.parent_kind == "child"), key=_position)

    def child_workflow(self, target: Any) -> Workflow[Any, Any]:
        """The registered workflow a ``ctx.child`` names (a workflow, an agent's
        workflow, or a name)."""
        return self._get_workflow(target)

    def start_child(
        self,
        workflow: Workflow[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: str,
        parent: str,
        parent_step: str,
        on_parent_close: ParentClose = "cancel",
    ) -> str:
        """Create the child run ``key`` names, or find it (a replay); its id.
        ``on_parent_close``: what the parent's end does to it (kept on its row)."""
        encoded = self._redact(workflow.encode_input(tuple(args), dict(kwargs)))
        record = self._store.get_run(parent)
        traceparent = child_traceparent(
            parent, record.traceparent if record is not None else None, parent_step
        )
        child, created = self._store.create_run(
            run_id=new_id(),
            workflow=workflow.name,
            input=encoded,
            key=key,
            now=self._clock.now(),
            traceparent=traceparent,
            parent=parent,
            parent_step=parent_step,
            # The code running the parent starts it: its version, so the workers
            # that may take the parent may take the child too.
            version=self._version,
            parent_close=on_parent_close,
        )
        if created:
            return child.id
        if child.parent != parent or loads(child.input) != loads(encoded):
            raise RunConflict(
                f"the child key {key!r} already names a run of {workflow.name!r} with other "
                "input (or of another parent): give each child of a run its own key",
                run_id=parent,
            )
        if child.parent_step != parent_step:
            # The key started another child of this session already (at another
            # step): that child's end went to the wait of its own start, so this one
            # would wait for ever. Said at once, never a silent hang.
            raise ConfigError(
                f"the child key {key!r} already started run {child.id} at step "
                f"{child.parent_step} of this session of run {parent!r}, and step "
                f"{parent_step} starts a child under it again: a key names one child per "
                "session (continue_as_new starts afresh); give each child of a session its "
                "own key, or await the first handle again",
                run_id=parent,
            )
        return child.id


def _position(run: RunRecord) -> tuple[int, int]:
    session, _, seq = (run.parent_step or "0:0").partition(":")
    return int(session), int(seq or 0)
