"""The trigger of a known failure: the case conditions its reproducer needs to fail the way it does.

A bug identity (findings/identity.py) names *what* went wrong; two different bugs can share one (a new
regression that refuses valid inputs on the path of a known refusal). A known corpus entry is therefore
scoped to its trigger as well: the conditions, in the case's own terms, under which the recorded failure
appears. A campaign failure with the entry's identity counts as known only when its case meets every
condition (findings/known.py); otherwise it is new.

The conditions are drawn from a fixed vocabulary of case features, each with a *plain* value. How the case
hands over its inputs, each plain value being the one the minimizer reduces every case towards
(campaign/minimize.py's ``defaults``, ``fewer_pools``):

* ``tuning.<knob>``: a backend knob's value ("" where the case leaves the backend's default), e.g.
  ``tuning.controller = base`` (sglang's base HiCacheController placing the indices);
* ``host_index.device`` / ``host_index.dtype`` / ``device_index.device`` / ``device_index.dtype``: how each
  side's index list is handed over (plain: int64 on the device);
* ``host_memory``: ``pinned`` (plain: pin_memory or host_register, the same to every contract rule) or
  ``pageable``;
* ``host_pool_group``: ``single`` (one pool, plain), ``uniform`` (a HostPoolGroup whose pools agree on the
  staged write-back capability: their ``write_back_jit`` flag and a 16-byte row multiple) or ``mixed``
  (they disagree, so the group's facade flag is False).

The shape of the host pool, which the minimizer keeps (it never changes a case's layout or attention kind, and
``tighter_pools`` lowers host pages, away from plain), so a failure has them in its trigger only where a relaxed
case, run or predicted, shows it needs them:

* ``layout``: the case's host layout, ``layer_first`` (plain), ``page_first``, ``page_first_direct``,
  ``page_head`` or ``page_unified``; relaxed to layer_first (and one head group, the only count layer_first
  takes);
* ``attention``: ``mla`` where some pool of the case is MLA, else ``mha_asym`` where some MHA pool's K and V rows
  differ, else ``mha`` (plain): sglang builds another host pool class for each. Relaxed by making each MLA pool
  an MHA pool of one head of the latent row's width (valid on every layout MLA takes) and each asymmetric pool
  the MHA pool of its K rows;
* ``host_pages``: ``fewer_than_layers`` where the case's host pages are fewer than the layers sglang's host pool
  is built with (kernels/sglang_hicache_settings.py's ``host_pool_layers``: the DSA indexer's MLA anchor holds
  skipped layers and drafts too), else ``at_least_layers`` (plain). sglang's MLA host pool on page_first_direct
  (and page_unified) takes its per-layer views along the page axis and cannot be built then. Relaxed by raising
  the host slots to one page per such layer (host indices past the end keep their distance from it).

A trigger is derived when an entry is recorded (:func:`derive_trigger`). Where the failing case can be run (the
minimizer on the machine that found it, ``hicache-fuzz minimize``), or the contract decides its identity: the
non-plain features whose removal alone (the case relaxed to the feature's plain value, :func:`_relaxed`) loses
the signature, the host pool's shape included. Otherwise: the non-plain features of how the inputs are handed
over (the ones the minimizer could not remove while keeping the signature), never the shape, which nothing
tried. It is stored in the reproducer as plain JSON (``"trigger": {"tuning.controller": "base", ...}``); an
entry without one matches every case of its identity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hicache_fuzz.harness.findings.identity import contract_cause
from hicache_fuzz.harness.model.case import Attention, Case, CaseError, HostAllocator, HostLayout, IndexSpec, PoolSpec
from hicache_fuzz.harness.model.outcome import Result
from hicache_fuzz.kernels.base import Backend
from hicache_fuzz.kernels.sglang_hicache_settings import host_pool_layers
from hicache_fuzz.oracles.contract import Platform, predict

TUNING_PREFIX = "tuning."
_INDEX_SIDES = ("host_index", "device_index")
# feature -> plain value; tuning.<knob> features are open-ended, their plain value is "" (the default)
PLAIN: dict[str, str] = {
    "host_index.device": IndexSpec().device.value,
    "host_index.dtype": IndexSpec().dtype.value,
    "device_index.device": IndexSpec().device.value,
    "device_index.dtype": IndexSpec().dtype.value,
    "host_memory": "pinned",
    "host_pool_group": "single",
    "layout": HostLayout.LAYER_FIRST.value,
    "attention": "mha",
    "host_pages": "at_least_layers",
}

# the host pool's shape: a condition of a trigger only where a relaxed case was run (or predicted) and lost the failure
SHAPE_FEATURES = frozenset({"layout", "attention", "host_pages"})

StillFails = Callable[[Case], bool]


class TriggerError(ValueError):
    """A stored trigger that does not follow the format; the message names the field."""


def _write_back_capable(pool: PoolSpec) -> bool:
    return pool.write_back_jit and all(pool.row_bytes(c) % 16 == 0 for c in pool.components)


def pool_group(case: Case) -> str:
    """single | uniform | mixed: whether the case's pools form a HostPoolGroup, and whether its pools agree
    on the staged write-back capability (a disagreement turns the group's facade flag False)."""
    if len(case.pools) == 1:
        return "single"
    return "uniform" if len({_write_back_capable(p) for p in case.pools}) == 1 else "mixed"


def attention(case: Case) -> str:
    """mla | mha_asym | mha: "mla" where some pool of the case is MLA (sglang builds an MLA host pool for it),
    else "mha_asym" where some pool is an MHA pool whose K and V rows differ (its own host pool class), else
    "mha"."""
    if any(p.attention is Attention.MLA for p in case.pools):
        return "mla"
    return "mha_asym" if any(p.attention is Attention.MHA_ASYM for p in case.pools) else "mha"


def host_pages(case: Case) -> str:
    """fewer_than_layers | at_least_layers: the case's host pages against the layers sglang's host pool holds."""
    return "fewer_than_layers" if case.host_pages < host_pool_layers(case) else "at_least_layers"


def _as_mha(pool: PoolSpec) -> PoolSpec:
    """An MLA pool as the MHA pool of one head of the same width (K and V rows each the latent row's size); an
    asymmetric MHA pool as the MHA pool of its K rows (V as wide as K)."""
    if pool.attention is Attention.MLA:
        return dataclasses.replace(pool, attention=Attention.MHA)
    if pool.attention is Attention.MHA_ASYM:
        return dataclasses.replace(pool, attention=Attention.MHA, v_head_dim=None)
    return pool


def _enough_host_pages(case: Case) -> Case:
    """`case` with one host page per host pool layer; host indices past the end keep their distance from it."""
    old = case.host_slots
    slots = max(old, host_pool_layers(case) * case.page_size)
    host = tuple(v + slots - old if v >= old else v for v in case.host_indices)
    return case.replace(host_slots=slots, host_indices=host)


def features(case: Case) -> dict[str, str]:
    """Every trigger feature of `case` with its value (tuning knobs only where the case sets them)."""
    out = {f"{side}.{part}": getattr(getattr(case, side), part).value
           for side in _INDEX_SIDES for part in ("device", "dtype")}
    out["host_memory"] = "pageable" if case.host_allocator is HostAllocator.PAGEABLE else "pinned"
    out["host_pool_group"] = pool_group(case)
    out["layout"] = case.layout.value
    out["attention"] = attention(case)
    out["host_pages"] = host_pages(case)
    out.update({TUNING_PREFIX + name: str(value) for name, value in case.tuning})
    return out


def plain_value(feature: str) -> str:
    return "" if feature.startswith(TUNING_PREFIX) else PLAIN[feature]


def in_trigger(trigger: dict[str, str], case: Case) -> bool:
    """True if `case` meets every condition of `trigger` (an empty trigger: every case)."""
    values = features(case)
    return all(values.get(name, plain_value(name)) == value for name, value in trigger.items())


def outside_trigger(trigger: dict[str, str], case: Case) -> dict[str, str]:
    """The conditions of `trigger` that `case` does not meet, with the case's own value for each."""
    values = features(case)
    return {name: values.get(name, plain_value(name)) for name, value in trigger.items()
            if values.get(name, plain_value(name)) != value}


def _relaxed(case: Case, feature: str) -> Case | None:
    """`case` with `feature` set back to its plain value (None where no such case exists)."""
    try:
        if feature.startswith(TUNING_PREFIX):
            knob = feature[len(TUNING_PREFIX):]
            return case.replace(tuning=tuple((k, v) for k, v in case.tuning if k != knob))
        if feature == "host_memory":
            return case.replace(host_allocator=HostAllocator.PIN_MEMORY)
        if feature == "host_pool_group":
            return case.replace(pools=case.pools[:1])
        if feature == "layout":
            return case.replace(layout=HostLayout.LAYER_FIRST,
                                pools=tuple(dataclasses.replace(p, head_groups=1) for p in case.pools))
        if feature == "attention":
            return case.replace(pools=tuple(_as_mha(p) for p in case.pools))
        if feature == "host_pages":
            return _enough_host_pages(case)
        side, _, part = feature.partition(".")
        spec: IndexSpec = getattr(case, side)
        plain = IndexSpec()
        if part == "device":
            return case.replace(**{side: IndexSpec(spec.dtype, plain.device)})
        # Index dtypes that agree are relaxed together: one side alone would break the rule that both sides
        # share a dtype (the register kernel's), a different input rather than a plainer one.
        sides = [s for s in _INDEX_SIDES if s == side or getattr(case, s).dtype is spec.dtype]
        return case.replace(**{s: IndexSpec(plain.dtype, getattr(case, s).device) for s in sides})
    except CaseError:
        return None


def trigger_runs(case: Case) -> int:
    """How many cases :func:`derive_trigger` runs for `case`: one per feature that is not plain."""
    return sum(1 for name, value in features(case).items() if value != plain_value(name))


def derive_trigger(case: Case, still_fails: StillFails | None = None) -> dict[str, str]:
    """The trigger of the failure `case` shows. With `still_fails` (runs a case, or asks the contract, and says
    whether it fails with the signature being kept): its features that are not plain, less those whose removal
    alone keeps the failure (the failure does not need them). Without it: its non-plain features of how the
    inputs are handed over, the case being taken as minimized (the minimizer tried removing each of them). The
    host pool's shape (SHAPE_FEATURES) then stays out: the minimizer never tried it, so nothing shows the
    failure needs it, and a condition the failure does not need would turn its next sighting on another shape
    into a new bug."""
    trigger = {name: value for name, value in sorted(features(case).items()) if value != plain_value(name)}
    if still_fails is None:
        return {name: value for name, value in trigger.items() if name not in SHAPE_FEATURES}
    needed = {}
    for name, value in trigger.items():
        relaxed = _relaxed(case, name)
        if relaxed is None or relaxed == case or not still_fails(relaxed):
            needed[name] = value
    return needed


def predicted_by_contract(backend: Backend, platform: Platform, case: Case, result: Result) -> StillFails | None:
    """Without running: whether a relaxed case fails the way `result` did, for the failures whose identity the
    contract decides (an input accepted, or a crash or hang on an input, that breaks a rule the path does not
    check: identity.py). The relaxed case shows that bug when the backend plans the same path for it and the
    contract names the same primary broken rule. None for the other failures (a valid input rejected, a
    mismatch, a crash on valid input): only running a case tells whether it still shows them."""
    cause = contract_cause(result)
    if not cause:
        return None
    path = backend.plan(case, platform).path

    def still_fails(relaxed: Case) -> bool:
        if backend.unsupported_reason(relaxed, platform) is not None:
            return False
        plan = backend.plan(relaxed, platform)
        prediction = predict(relaxed, plan.entry, platform).describe()
        return plan.path == path and contract_cause(result, prediction) == cause

    return still_fails


def trigger_from_json(data: Any, where: str) -> dict[str, str]:
    """A stored trigger, checked: an object of known feature names to non-empty strings."""
    if not isinstance(data, dict):
        raise TriggerError(f"{where}: must be an object of feature -> value")
    for name, value in data.items():
        if not (name in PLAIN or (name.startswith(TUNING_PREFIX) and len(name) > len(TUNING_PREFIX))):
            raise TriggerError(f"{where}: unknown feature {name[:60]!r} (known: {sorted(PLAIN)} and tuning.<knob>)")
        if not isinstance(value, str) or not value:
            raise TriggerError(f"{where}.{name}: must be a non-empty string")
    return dict(sorted(data.items()))


def describe(trigger: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in trigger.items()) if trigger else "any case"
