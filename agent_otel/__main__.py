"""``python -m agent_otel``: the ``agent-otel`` command, where its script is not on PATH."""

import sys

from agent_otel.commands.cli import main

sys.exit(main())
