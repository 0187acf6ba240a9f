"""PNG plots of a lab result (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import MissingExtra
from ._profile import POLICIES
from ._run import PASS_K, LabResult
from ._stats import theory_success

__all__ = ["plot_results"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingExtra("the lab's plots", "lab", exc.name) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_results(result: LabResult, directory: str | os.PathLike[str]) -> list[str]:
    """Write ``success_vs_steps.png``, ``pass_k.png`` and ``failure_causes.png``.

    Returns:
        The file names written, inside ``directory``.

    Raises:
        ImportError: matplotlib is missing (``pip install 'mainspring[lab]'``).
    """
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    colours = dict(
        zip(POLICIES, ("#d62728", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c"), strict=True)
    )
    p = result.profile
    written = []

    # 1. success against step count, with the theory curves dashed
    fig, ax = plt.subplots(figsize=(7, 4.5))
    steps = list(result.steps)
    for policy in result.policies:
        cells = [result.cell(policy, n) for n in steps]
        rates = [c.success_rate for c in cells]
        err = [  # clamped: at 0 % or 100 % the interval's far end meets the rate
            [max(0.0, c.success_rate - c.ci_low) for c in cells],
            [max(0.0, c.ci_high - c.success_rate) for c in cells],
        ]
        ax.errorbar(
            steps, rates, yerr=err, marker="o", capsize=3, label=policy, color=colours[policy]
        )
    dense = list(range(1, max(steps) + 1))
    e = p.step_error_rate
    ax.plot(dense, [theory_success(e, n) for n in dense], "k--", lw=1, label=f"p^n (e={e:.3g})")
    if p.retries:
        ax.plot(
            dense,
            [theory_success(e, n, p.retries) for n in dense],
            "k:",
            lw=1,
            label=f"(1-(1-p)^{p.retries + 1})^n",
        )
    ax.set_xlabel("steps in the task")
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Success against task length")
    fig.tight_layout()
    fig.savefig(out / "success_vs_steps.png", dpi=110)
    plt.close(fig)
    written.append("success_vs_steps.png")

    # 2. pass^k against k, at the longest chain
    longest = max(steps)
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in result.policies:
        c = result.cell(policy, longest)
        ks = [k for k in PASS_K if c.pass_k[k] is not None]
        ax.plot(ks, [c.pass_k[k] for k in ks], marker="o", label=policy, color=colours[policy])
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(PASS_K), [str(k) for k in PASS_K])
    ax.set_xlabel("k")
    ax.set_ylabel("pass^k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"pass^k, {longest} steps")
    fig.tight_layout()
    fig.savefig(out / "pass_k.png", dpi=110)
    plt.close(fig)
    written.append("pass_k.png")

    # 3. failure causes per policy (all chain lengths together)
    causes = sorted({k for c in result.cells for k in c.causes})
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0] * len(result.policies)
    for cause in causes:
        counts = [
            sum(c.causes.get(cause, 0) for c in result.cells if c.policy == policy)
            for policy in result.policies
        ]
        ax.bar(list(result.policies), counts, bottom=bottom, label=cause)
        bottom = [b + n for b, n in zip(bottom, counts, strict=True)]
    ax.set_ylabel("failed trials")
    ax.set_title("Failure causes (all task lengths)")
    if causes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "failure_causes.png", dpi=110)
    plt.close(fig)
    written.append("failure_causes.png")
    return written
