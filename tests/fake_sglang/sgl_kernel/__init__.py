"""Fake sgl_kernel (CPU tests of the standalone reproducers)."""
