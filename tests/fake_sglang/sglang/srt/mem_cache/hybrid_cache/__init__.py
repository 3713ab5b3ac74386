"""Fake hybrid cache package."""
