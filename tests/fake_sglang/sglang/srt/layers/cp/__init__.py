"""Fake sglang for the CPU tests of the standalone reproducers (not the real package)."""
