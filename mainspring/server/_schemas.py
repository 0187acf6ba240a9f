"""The HTTP API's bodies: pydantic models at the edge, documented in OpenAPI."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AnswerIn",
    "CancelIn",
    "ErrorBody",
    "ErrorOut",
    "QueueOut",
    "RequestOut",
    "RunList",
    "RunOut",
    "SignalIn",
    "SignalOut",
    "StepList",
    "StepOut",
    "SubmitIn",
    "SubmitOut",
    "WebhookIn",
    "WebhookOut",
]

RunStatusName = Literal[
    "queued", "running", "sleeping", "waiting", "succeeded", "failed", "cancelled"
]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    type: str = Field(description="A stable, machine-readable name of the problem.")
    message: str = Field(description="What was wrong, naming the field or value.")
    details: list[dict[str, Any]] | None = None


class ErrorOut(BaseModel):
    error: ErrorBody


class SubmitIn(_In):
    workflow: str = Field(min_length=1, max_length=200, description="A registered workflow.")
    args: list[Any] = Field(default_factory=list, description="Positional arguments.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments.")
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Idempotency key: the same key returns the same run "
        "(also accepted as the Idempotency-Key header).",
    )
    queue: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="A queue the App declares (app.queue): the run starts within its limits.",
    )
    queue_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The run's key in its queue, for the queue's per-key limit.",
    )
    priority: int = Field(
        default=0,
        ge=-(2**31) + 1,
        le=2**31 - 1,
        description="The run's priority in its queue: higher starts first.",
    )


class SubmitOut(BaseModel):
    id: str
    workflow: str
    status: RunStatusName
    created: bool = Field(description="False when an idempotency key named an existing run.")
    url: str


class RequestOut(BaseModel):
    run_id: str
    workflow: str
    id: str = Field(description="The request's id within its run; answer at its URL.")
    kind: Literal["approval", "question"]
    title: str
    preview: Any = None
    choices: list[str] | None = None
    created_at: float
    deadline: float | None = None
    on_timeout: Literal["approve", "reject", "answer", "fail"] | None = Field(
        default=None,
        description="What happens at the deadline (a wait with a timeout): the approval's"
        " default decision, the question's default answer (answer), or the run fails (fail).",
    )
    default_answer: str | None = Field(
        default=None, description="A question's default answer, given at the deadline."
    )
    url: str


class CurrentStep(BaseModel):
    session: int
    seq: int
    kind: str
    name: str
    status: str


# A journal row: the step a run's ``current_step`` names, with its attempt, times and
# values. (A docstring would become the schema's description in the OpenAPI document.)
class StepOut(CurrentStep):
    attempt: int
    started_at: float
    finished_at: float | None = None
    output: Any = None
    error: Any = None


class UsageOut(BaseModel):
    tokens_in: int
    tokens_out: int
    cost_usd: float
    model_calls: int = Field(description="Completed model calls counted.")


class RunUsageOut(BaseModel):
    own: UsageOut = Field(description="The run's own model calls.")
    children: UsageOut = Field(description="Its child runs' (and theirs), together.")
    with_children: UsageOut = Field(description="The run's and its children's together.")
    duration_s: float = Field(description="Submission to end (to now while it runs).")
    truncated: bool = Field(
        False, description="The tree of children was too large and partly left out."
    )


class ChildOut(BaseModel):
    id: str
    workflow: str
    status: RunStatusName
    parent_step: str | None = Field(
        None, description="The parent's step that started it, 'session:seq'."
    )
    parent_close: Literal["cancel", "abandon"] | None = Field(
        None,
        description="What the parent's end does to it (on_parent_close): 'cancel' or "
        "'abandon'; null: started before the policy existed.",
    )
    url: str
    duration_s: float | None = Field(
        None, description="The child's duration (submission to end, to now while it runs)."
    )
    usage: UsageOut | None = Field(
        None, description="What the child and its own children spent, together."
    )


class RunOut(BaseModel):
    id: str
    workflow: str
    key: str | None
    status: RunStatusName
    session: int
    recoveries: int
    created_at: float
    updated_at: float
    finished_at: float | None
    wait_reason: str | None = None
    wake_at: float | None = None
    input: Any = None
    output: Any = None
    error: Any = None
    current_step: CurrentStep | None = None
    pending_requests: list[RequestOut] = Field(default_factory=list)
    parent: str | None = Field(
        None,
        description="A fork's source run, or the run that started this one as a child "
        "(null: neither).",
    )
    parent_step: str | None = Field(
        None,
        description="The parent's step the fork was made from, or that started the "
        "child, 'session:seq'.",
    )
    parent_kind: Literal["fork", "child"] | None = Field(
        None, description="What the parent is to this run: 'fork' or 'child'."
    )
    parent_close: Literal["cancel", "abandon"] | None = Field(
        None,
        description="A child's parent-close policy (on_parent_close): 'cancel' (the "
        "parent's end cancels it) or 'abandon' (it runs on); null: a fork, no parent, "
        "or a child started before the policy existed.",
    )
    children: list[ChildOut] = Field(
        default_factory=list,
        description="The child runs this run started (ctx.child), in order; in a run's "
        "own view only.",
    )
    version: str | None = Field(
        None,
        description="The code version of the App that submitted the run "
        "(App(version=...)); null: none declared.",
    )
    schedule: str | None = Field(
        None,
        description="The schedule that started the run (its key names the due time); "
        "null: not started by a schedule.",
    )
    queue: str | None = Field(None, description="The queue the run was submitted to.")
    queue_key: str | None = Field(None, description="The run's key in its queue.")
    priority: int = Field(0, description="The run's priority in its queue (higher first).")
    worker: str | None = Field(
        None, description="The worker that holds the run (while it is running)."
    )
    lease_until: float | None = Field(
        None, description="When the holder's lease ends unless its heartbeat renews it."
    )
    usage: RunUsageOut | None = Field(
        default=None,
        description="Tokens, cost and duration, with and without the run's children; in "
        "a run's own view only.",
    )


class QueueOut(BaseModel):
    name: str
    concurrency: int | None = Field(
        description="Runs of the queue in progress at once (null: any): running, or "
        "sleeping on a retry back-off."
    )
    per_key: int | None = Field(
        description="Runs of one queue key in progress at once (null: any)."
    )
    rate: float | None = Field(description="Starts per second (null: no limit).")
    burst: int = Field(description="Starts the rate lets through back to back.")
    running: int = Field(description="Runs of the queue running (each holds a slot).")
    queued: int = Field(description="Runs waiting for their first start.")
    waiting: int = Field(
        description="Runs sleeping or waiting: only those of `retrying` hold a slot."
    )
    retrying: int = Field(
        default=0,
        description="Of the waiting runs, those sleeping on a retry back-off: each keeps its slot.",
    )


class RunList(BaseModel):
    runs: list[RunOut] = Field(
        description="Summaries: no input or output (GET the run's URL for those)."
    )
    next: str | None = Field(description="The next page, if there may be one.")


class StepList(BaseModel):
    steps: list[StepOut]


class SignalIn(_In):
    name: str = Field(min_length=1, max_length=200)
    payload: Any = None


class SignalOut(BaseModel):
    run_id: str
    name: str
    signal_id: int


class AnswerIn(_In):
    decision: Literal["approve", "reject", "edit"] | None = Field(
        default=None, description="For an approval."
    )
    reason: str | None = Field(default=None, max_length=10_000)
    arguments: dict[str, Any] | None = Field(default=None, description="With decision 'edit'.")
    answer: str | None = Field(default=None, max_length=100_000, description="For a question.")


class ForkIn(_In):
    from_step: (
        Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=r"^[0-9]+(:[0-9]+)?$")]
    ) = Field(
        description="Keep the journal up to this step, inclusive: its seq in the run's "
        "current session, or 'session:seq'.",
    )
    edit: Any = Field(
        default=None,
        description="A JSON merge patch (RFC 7386) applied to that step's recorded "
        "output, so the new run continues from an edited result. Omit it to keep it. "
        "A request's step (an approval, a question) cannot be edited.",
    )
    decisions: Literal["ask", "keep"] = Field(
        default="ask",
        description="'ask': the fork asks every request to a human at or before the "
        "step again (its journal stops before the first). 'keep': the answers are "
        "copied, recorded as this key's decisions (needs the 'approve' scope).",
    )


class CancelIn(_In):
    reason: str | None = Field(default=None, max_length=10_000)


class CancelOut(BaseModel):
    id: str
    status: RunStatusName


class WebhookIn(_In):
    url: str = Field(pattern=r"^https?://", max_length=2000)
    events: list[Literal["run.waiting", "run.succeeded", "run.failed", "run.cancelled"]] = Field(
        default_factory=list, description="Empty: every event."
    )
    secret: str | None = Field(default=None, min_length=16, max_length=200)


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    created_at: float
    secret: str | None = Field(default=None, description="Shown once, when created.")


class Health(BaseModel):
    ok: bool
    store: str
    schema_version: int


class ReplayCheckIn(_In):
    runs: list[str] | None = Field(
        default=None, description="These runs (any status) instead of every unfinished run."
    )
    workflows: list[str] | None = Field(default=None, description="Only runs of these workflows.")
    versions: list[str | None] | Literal["any"] | None = Field(
        default=None,
        description="Only runs of these code versions (null in the list: runs with none; "
        '"any": every run). Default: the runs this server\'s App would claim.',
    )


class RunCheckOut(BaseModel):
    run_id: str
    workflow: str
    version: str | None
    status: str
    session: int
    verdict: Literal["clean", "diverged", "unknown workflow", "bad input", "error"]
    journaled: int = Field(description="Positions in the run's current session's journal.")
    reached: int = Field(description="The last position the code took (-1: none).")
    position: int | None = Field(description="Where it diverged.")
    expected: tuple[str, str] | None = Field(description="The journal's [kind, name] there.")
    got: tuple[str, str] | None = Field(description="What the code asked for there.")
    then: str | None = Field(description="What a worker would do next (a clean replay).")
    message: str
    hint: str | None = Field(description="What to do about a run that does not replay.")


class ReplayCheckOut(BaseModel):
    ok: bool = Field(description="Every run checked replays cleanly.")
    checked: int
    diverged: int = Field(description="Runs that do not replay cleanly, whatever the reason.")
    seconds: float
    summary: list[dict[str, Any]] = Field(
        description="Per workflow and version: the number of runs, and of each verdict."
    )
    runs: list[RunCheckOut]
