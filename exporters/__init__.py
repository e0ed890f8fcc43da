"""Exporters: where telemetry leaves the process (imported as agent_otel.exporters)."""
