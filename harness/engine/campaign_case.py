"""Case ``i`` of a campaign: the one definition the feed, the selftest's replay of a kill and the benchmarks use.

Case ``i`` depends on (seed, i, the backend's campaign space, the case mix) only, so campaigns shard, resume and
replay by index. The index variants the feed runs after a generated case (variants.py) follow from that case.
"""

from __future__ import annotations

from hicache_fuzz.harness.engine.mix import Mix, TransferProfile, mixed_case
from hicache_fuzz.harness.generation.generate import case_for_index
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.harness.model.space import CaseSpace
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.oracles.contract import Platform


def backend_space(backend: Backend, base_space: CaseSpace, platform: Platform, seed: int | None = None) -> CaseSpace:
    """The space a campaign with `seed` draws `backend`'s cases from (before menu growth is applied by index):
    the seed picks the backend's sample of its compiled menus (CaseSpace.menu_seed); None keeps the base
    space's (the whole menu unless the base names a seed)."""
    base = base_space.narrowed(backend=backend.name)
    if seed is not None:
        base = base.narrowed(menu_seed=seed)
    return backend.case_space(base, platform)


def campaign_case(seed: int, index: int, backend: Backend, space: CaseSpace, platform: Platform,
                  mix: Mix | None = None, profile: TransferProfile | None = None) -> Case:
    """Case `index` of `backend`'s campaign with `seed`, drawn from `space` (its campaign space, backend_space):
    with a case mix, the mix's pick for the index (`profile`: the backend's transfer profile, calibrated here
    when not given), else the plain draw."""
    if mix is None:
        return case_for_index(seed, index, space)
    if profile is None:
        profile = TransferProfile.calibrate(backend, space, platform)
    return mixed_case(seed, index, space, backend, platform, mix, profile)
