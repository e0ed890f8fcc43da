"""Commands: the ``agent-otel`` CLI and its subcommands (report, demo, gpu-exporter,
blame-service).
"""
