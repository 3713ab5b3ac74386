"""The exit codes of every command and tool, defined once, and the two errors that map onto them.

0 clean; 1 failures (findings) found; 2 bad usage or bad input (the message names the problem); 3 the
environment failed: the requested platform, backend or tool is unavailable, or a report could not be written
where it was asked and went elsewhere (the message says why and where). Findings take precedence over 3.
The stand-alone ISA tool uses the same codes, so it may import this module from the layers.
"""

from __future__ import annotations

EXIT_CLEAN = 0
EXIT_FAILURES = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130  # a second SIGINT (the first ends a campaign cleanly, with its report)


def final_exit_code(code: int, report_written: bool) -> int:
    """A command's exit code once its reports are written: a report that could not be written where the user
    asked (written elsewhere, the message says where) is an environment failure, 3, unless the run already
    ended with a worse verdict (1 findings, 2 bad input, or 3): every command (fuzz, gate, replay, selftest,
    bench, report, merge, backends, minimize) applies this one rule."""
    if code == EXIT_CLEAN and not report_written:
        return EXIT_UNAVAILABLE
    return code


class UsageError(Exception):
    """Bad arguments or input: exit code 2."""


class Unavailable(Exception):
    """The requested platform, backend or tool is not present: exit code 3."""
