"""Wiring: ``instrument()`` and what it builds from the settings (the pipeline,
the sinks, the framework instrumentors).
"""
