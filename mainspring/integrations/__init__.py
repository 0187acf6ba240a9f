"""Agents written with other frameworks, made durable on mainspring without a rewrite.

Each framework has a subpackage behind an optional extra (``mainspring[langgraph]``, ...):
``from mainspring.integrations.langgraph import durable``.
"""
