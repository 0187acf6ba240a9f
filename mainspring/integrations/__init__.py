"""Agents written with other frameworks, made durable on mainspring without a rewrite.

One subpackage per framework, each behind its optional extra (importing this package
imports none of them): ``mainspring.integrations.openai_agents`` (``pip install
'mainspring[openai-agents]'``), ``mainspring.integrations.pydantic_ai`` (``pip install
'mainspring[pydantic-ai]'``) and ``mainspring.integrations.langgraph`` (``pip install
'mainspring[langgraph]'``). See docs/bring-your-agent.md.
"""
