"""Support: small helpers every layer may use (clock, forks, text, files, the host).

Nothing here imports the rest of the toolkit but the contract
(``agent_otel.semconv``, ``config``, ``records``, ``errors``).
"""
