"""A planner agent that delegates to two specialist agents, each called as a tool
and run as a child run of the planner: a researcher (reads), and a publisher whose
``publish_post`` tool is irreversible, so a person approves each post first. The
publisher's approval is a request of the publisher's own run; the planner waits for
its sub-agent, holding no worker, until a reviewer answers. Scripted models play every
turn: ``python -m examples.planner`` runs it with no API key.
"""

from .agent import build

__all__ = ["build"]
