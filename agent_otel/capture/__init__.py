"""Capture: the hot path of a tool call.

``meta`` (what is fixed about a tool), ``recorder`` (begin and end one call),
``wrappers`` (the plain ``@tool`` wrappers and ``tool_span``), ``executors``
(the ``ThreadPoolExecutor.submit`` hook), ``patching`` (the one undo stack
every patch goes through) and ``frameworks/`` (one hook per agent framework).
Nothing here knows about GPUs, attribution or outputs.
"""
