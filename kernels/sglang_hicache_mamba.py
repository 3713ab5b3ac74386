"""``MambaPoolHost`` for ``sglang-hicache``: the Mamba state pool built through its own constructor and the case's
bytes mapped onto its tensors.

The pool holds per-request recurrent state: per layer one temporal (SSM) state and one conv state per slot, one
slot per page (page size 1). The oracle describes it as a two-component pool (oracles/pool_layouts.py): the
case's K row is the temporal state, its V row the conv state, so the device storage is the temporal tensor
``(layers, slots, heads, head_dim)`` followed by the conv tensor ``(layers, slots, heads, v_head_dim)`` and the host
storage the host pool's ``temporal_buffer`` then ``conv_buffer[0]`` (``(slots, layers, 1, ...)`` each).

Stand-in (``DevicePoolStandIn``): the device Mamba pool. Its constructor needs the model's cache parameters;
the host pool reads only the ``MambaStateBufferInfo`` the device pool exposes (sglang's own class, built here
over the case's device tensors), and the controller only the device, the layer count and the transfer counter.
sglang's modules for it are imported when a Mamba case is built, never at generation time or for other classes.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention, Case, PoolSpec

MAMBA = "MambaPoolHost"


class DevicePoolStandIn:
    """A device pool whose host pool is built from its buffer info alone (the Mamba state pool, MiniMax's NVFP4
    page-row pools), as far as the host pool and the controller use it: the info, device, layer range and the
    controller's transfer counter (see the module doc)."""

    layer_transfer_counter: Any = None

    def __init__(self, info: Any, layers: int, device: torch.device, start_layer: int) -> None:
        self.info, self.layer_num, self.device = info, layers, device
        self.start_layer, self.end_layer = start_layer, start_layer + layers

    def register_layer_transfer_counter(self, counter: Any) -> None:
        self.layer_transfer_counter = counter


def _widths(spec: PoolSpec) -> tuple[int, int]:
    """(temporal, conv) head dims: K's and V's of the case's pool."""
    return spec.head_dim, spec.v_head_dim if spec.attention is Attention.MHA_ASYM and spec.v_head_dim else (
        spec.head_dim)


def _state_info(info_class: Any, case: Case, layers: int, dtype: torch.dtype, device: torch.device) -> Any:
    spec = case.pools[0]
    temporal_dim, conv_dim = _widths(spec)
    rows = case.device_rows
    temporal = torch.zeros((layers, rows, spec.heads, temporal_dim), dtype=dtype, device=device)
    conv = torch.zeros((layers, rows, spec.heads, conv_dim), dtype=dtype, device=device)
    return info_class(temporal=temporal, conv=(conv,))


def build_mamba(case: Case, dtype: torch.dtype, device: torch.device, start: int, drafts: int) -> tuple[Any, list[Any],
                                                                                                          Any]:
    """(device pool stand-in, draft device pool stand-ins, host pool) of a Mamba case: the host pool through
    ``MambaPoolHost``'s own constructor (sized from the device capacity and a ratio chosen so that its own
    sizing, ``int(capacity * ratio) + 1`` slots, gives the case's host slots; packed draft layers as
    ``mtp_draft_buffer_infos``)."""
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    target = case.layers - drafts
    info = _state_info(MambaStateBufferInfo, case, target, dtype, device)
    device_pool = DevicePoolStandIn(info, target, device, start)
    draft_pools = [DevicePoolStandIn(_state_info(MambaStateBufferInfo, case, 1, dtype, device), 1, device, 0)
                   for _ in range(drafts)]
    capacity = case.device_rows - case.page_size
    # the half slot keeps float rounding below the next integer
    ratio = (case.host_slots - 1 + 0.5) / capacity
    host_pool = MambaPoolHost(info, ratio, 0, device_capacity=capacity, pin_memory=True, device="cpu",
                              allocator_type="default", layout=case.layout.value,
                              mtp_draft_buffer_infos=[p.info for p in draft_pools])
    return device_pool, draft_pools, host_pool


def build_jit_module() -> object:
    """Build (or load) the transfer_mamba JIT module the pool's kernel io uses: one module, no template
    parameter, so the campaign's builder makes it before any case needs it."""
    from sglang.kernels.ops.mamba.transfer_mamba import _jit_transfer_mamba_module

    return _jit_transfer_mamba_module()


def device_tensors(device_pool: Any, drafts: list[Any], component: str) -> list[torch.Tensor]:
    """Per-layer device state tensors of one component (k: temporal, v: conv), target layers then drafts."""

    def of(pool: Any) -> list[torch.Tensor]:
        state = pool.info.temporal if component == "k" else pool.info.conv[0]
        return list(state.unbind(0))

    return of(device_pool) + [of(p)[0] for p in drafts]


def host_tensors(host_pool: Any) -> list[torch.Tensor]:
    return [host_pool.temporal_buffer, host_pool.conv_buffer[0]]
