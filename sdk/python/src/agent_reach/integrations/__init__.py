"""Adapters to the agent frameworks teams already use. Each needs its framework installed
(none is a dependency of ``agent_reach``); importing one without it raises ``ImportError``
naming the extra to install.

- :mod:`agent_reach.integrations.langchain` (``pip install 'agent-reach[langchain]'``):
  every capability the caller may call as LangChain/LangGraph tools
  (:func:`~agent_reach.integrations.langchain.capability_tools`), and a handler that runs a
  LangGraph graph (:func:`~agent_reach.integrations.langchain.graph_handler`).
"""
