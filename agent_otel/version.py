"""The version of agent-otel: the one place it is written.

pyproject.toml reads it (``dynamic = ["version"]``), and ``instrument()``
passes it to ``get_tracer`` as the instrumentation scope's version.
"""

__version__ = "0.1.0"
