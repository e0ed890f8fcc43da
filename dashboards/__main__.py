"""``python -m dashboards``: regenerate (or ``--check``) every artefact."""

import sys

from dashboards.build import main

sys.exit(main())
