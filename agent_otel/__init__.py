"""agent-otel"""
