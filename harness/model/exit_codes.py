"""The exit codes of every command and tool, defined once, and the two errors that map onto them.

0 clean; 1 failures (findings) found; 2 bad usage or bad input (the message names the problem); 3 the
requested platform, backend or tool is unavailable (the message says why). The stand-alone ISA tool uses the
same codes, so it may import this module (and only this one) from the layers.
"""

from __future__ import annotations

EXIT_CLEAN = 0
EXIT_FAILURES = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130  # a second SIGINT (the first ends a campaign cleanly, with its report)


class UsageError(Exception):
    """Bad arguments or input: exit code 2."""


class Unavailable(Exception):
    """The requested platform, backend or tool is not present: exit code 3."""
