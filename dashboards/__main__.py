"""``python -m dashboards``: regenerate (or ``--check``) every artefact.

It runs from a checkout of the repository (``dashboards/`` is not
installed) and needs the dev extra on Python 3.11 or later (the Grafana
Foundation SDK, PyYAML): where one is missing it says so in one line.
"""

import sys

INSTALL = "pip install -e '.[dev]' (in the repository, on Python 3.11 or later)"

if sys.version_info < (3, 11):
    print(
        f"python -m dashboards: needs Python 3.11 or later (grafana-foundation-sdk), not "
        f"{sys.version_info[0]}.{sys.version_info[1]}; then {INSTALL}",
        file=sys.stderr,
    )
    sys.exit(2)
try:
    import grafana_foundation_sdk  # noqa: F401
    import yaml  # noqa: F401

    import agent_otel.semconv  # noqa: F401 (the contract the dashboards read)
except ModuleNotFoundError as missing:
    print(f"python -m dashboards: needs {missing.name}, which the dev extra installs: {INSTALL}", file=sys.stderr)
    sys.exit(2)

from dashboards.build import main  # noqa: E402

sys.exit(main())
