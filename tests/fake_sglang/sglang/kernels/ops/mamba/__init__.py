"""Fake sglang Mamba kernel ops."""
