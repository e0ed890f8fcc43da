"""Dashboards, alert rules and their tests, as code.

``python -m dashboards`` regenerates every artefact committed beside this
package: the Grafana dashboards in ``dashboards/json/`` and the Prometheus
rules in ``dashboards/rules/agent-otel-rules.yml``. ``python -m dashboards
--check`` fails when the committed files differ from what the code
generates. This package is a repository tool, not part of the installed
``agent-otel`` distribution; it never imports the toolkit's runtime.
"""
