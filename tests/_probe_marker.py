"""Imported by tests/_probe_plugin.py's gated probe: appends this process's pid to $TEST_PROBE_MARKER."""

import os

if os.environ.get("TEST_PROBE_MARKER"):
    with open(os.environ["TEST_PROBE_MARKER"], "a") as marker:
        marker.write(f"{os.getpid()}\n")
