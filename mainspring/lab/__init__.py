"""The reliability lab: seed 000's sandbox made a product feature.

Run a task under a fault profile for many seeded trials and compare policies —
the naive loop, step retries, checkpoint and resume, validators and repair, and
full mainspring — by success rate (Wilson intervals), pass^k, steps to failure,
recoveries, duplicate effects, tokens and cost per success (:func:`run_lab` on seed
000's chain, :func:`run_workflow_lab` on your own workflow or agent);
kill real worker processes at random and audit the journal and the effect ledger
(:func:`run_chaos`); run long agent tasks under model, provider and process
faults (:func:`run_suite`, the horizon suite: its provider :class:`SuiteModelServer`,
its kill points :class:`SuiteFaults`, peer contenders :class:`RunnerContender`, other
Apps :class:`AppContender`);
check a workflow or agent against the pre-release checklist (:func:`preflight`);
report a shadow of recorded runs (``App.shadow``) as a page (:func:`shadow_html`) and
keep the runs it changed as a regression suite CI replays (:func:`save_regressions`,
:func:`run_regressions`).
"""

from ._chaos import ChaosResult, run_chaos
from ._faults import FaultHook
from ._imports import import_object
from ._plots import plot_results
from ._preflight import CHECKS, Finding, PreflightReport, preflight
from ._profile import POLICIES, POLICY_TITLES, FailureCause, LabProfile, Policy, parse_policies
from ._report import failure_lines, html_report, markdown_report, rich_table
from ._run import PASS_K, Cell, LabResult, TrialFailure, parse_steps, run_lab
from ._shadow_report import shadow_html, shadow_lines
from ._shadow_suite import (
    Regression,
    RegressionResult,
    Regressions,
    load_regressions,
    run_regressions,
    save_regressions,
)
from ._stats import pass_hat_k, theory_success, wilson
from ._stubs import lab_stubs
from ._suite import SuiteCell, SuiteProfile, run_suite, suite_markdown
from ._suite_contenders import AppContender, Contender, RunnerContender
from ._suite_faults import KillRates, ProviderFaults, SuiteFaults
from ._suite_model import SuiteModelServer
from ._suite_report import suite_html
from ._target import LabTarget, parse_json_args, resolve_target, run_workflow_lab
from ._tasks import TASKS, PolicyRates, SuiteWorld, TaskSpec, ToolDef, decide

__all__ = [
    "CHECKS",
    "PASS_K",
    "POLICIES",
    "POLICY_TITLES",
    "TASKS",
    "AppContender",
    "Cell",
    "ChaosResult",
    "Contender",
    "FailureCause",
    "FaultHook",
    "Finding",
    "KillRates",
    "LabProfile",
    "LabResult",
    "LabTarget",
    "Policy",
    "PolicyRates",
    "PreflightReport",
    "ProviderFaults",
    "Regression",
    "RegressionResult",
    "Regressions",
    "RunnerContender",
    "SuiteCell",
    "SuiteFaults",
    "SuiteModelServer",
    "SuiteProfile",
    "SuiteWorld",
    "TaskSpec",
    "ToolDef",
    "TrialFailure",
    "decide",
    "failure_lines",
    "html_report",
    "import_object",
    "lab_stubs",
    "load_regressions",
    "markdown_report",
    "parse_json_args",
    "parse_policies",
    "parse_steps",
    "pass_hat_k",
    "plot_results",
    "preflight",
    "resolve_target",
    "rich_table",
    "run_chaos",
    "run_lab",
    "run_regressions",
    "run_suite",
    "run_workflow_lab",
    "save_regressions",
    "shadow_html",
    "shadow_lines",
    "suite_html",
    "suite_markdown",
    "theory_success",
    "wilson",
]
