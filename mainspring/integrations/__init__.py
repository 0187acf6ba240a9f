"""Agents written with other frameworks, made durable on mainspring without a rewrite.

Each integration is a subpackage behind an optional extra:
``mainspring.integrations.openai_agents`` (``pip install 'mainspring[openai-agents]'``).
"""
