"""A third-party-style backend plugin for the CLI tests: the reference with its last page dropped."""

from __future__ import annotations

from hicache_fuzz.api import Backend, Case, ReferenceBackend


class DropsLastPage(ReferenceBackend):
    name = "test-drops-last-page"
    description = "test plugin: forgets the last page of every transfer"

    def expand(self, case: Case, host: list[int], device: list[int]) -> tuple[list[int], list[int]]:
        host, device = super().expand(case, host, device)
        keep = max(0, len(host) - case.page_size)
        if len(host) > case.page_size:
            return host[:keep], device[:keep]
        return host, device


def backends() -> list[Backend]:
    return [DropsLastPage()]
