"""``agent-otel demo``: a small agent on a (simulated) GPU, run as commonly
written and fixed, and the report of what blocked the GPU in each.

``tools`` holds the tools and the scripted services behind them, ``agent``
the two ways of serving the conversations, ``gpu`` where the model steps
run, ``runs`` one scenario under ``instrument()``, and ``command`` the
command line. docs/demo.md explains the output.
"""
