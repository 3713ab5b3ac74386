"""A backend plugin whose import ends the process (``sys.exit(0)`` at module level)."""

from __future__ import annotations

import sys

sys.exit(0)
