"""Side pools of the hybrid controller's group for ``sglang-hicache``: a pool beside the anchor that no transfer
names.

sglang's HostPoolGroup derives its capability flags from every child (``can_use_write_back_jit``: all of them,
``supports_per_pool_backup_indices``: any of them), and the HybridCacheController places the back-up indices by
those flags before it asks each pool. A side pool whose flag disagrees with the anchor's therefore changes the
path the anchor's own transfer takes, although the side pool moves nothing (no ``extra_pools`` are given). The
side pool is built through its own constructor, as sglang's assembler builds it: a K-only index pool
(``MHATokenToKOnlyPoolHost`` over an ``MHATokenToKOnlyPool``, sized from the anchor host pool, ``PoolName.INDEXER``)
or a Mamba state pool (``MambaPoolHost``, ``PoolName.MAMBA``). What must hold (docs/semantics.md, 9.3): its bytes
after the sequence are the bytes before it.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels import sglang_hicache_mamba as mamba

K_ONLY = "MHATokenToKOnlyPoolHost"
# The side pools' own rows (bytes): one head of 8 elements of the anchor's dtype; any width does (nothing moves).
SIDE_HEAD_DIM = 8


class SidePool:
    """A side pool's device and host objects, and the tensors whose bytes must stay as they were."""

    def __init__(self, name: str, device_pool: Any, host_pool: Any, host: list[torch.Tensor],
                 device: list[torch.Tensor]) -> None:
        self.name, self.device_pool, self.host_pool = name, device_pool, host_pool
        self.host, self.tensors = host, host + device
        self.before: list[torch.Tensor] = []

    def fill_and_snapshot(self) -> None:
        """Give every byte a value that a stray transfer would change (host and device bytes differ: a byte
        counts up over the device tensors, the host bytes are 0xA5), then record them."""
        for tensor in self.tensors:
            flat = tensor.view(torch.uint8).view(-1)
            if any(tensor is h for h in self.host):
                flat.fill_(0xA5)
            else:
                flat.copy_(torch.arange(flat.numel(), device=flat.device) % 251)
        self.before = [t.view(torch.uint8).clone() for t in self.tensors]

    def changed(self) -> str:
        """'' if every tensor holds its snapshot's bytes, else which one does not."""
        for index, (tensor, before) in enumerate(zip(self.tensors, self.before, strict=True)):
            if not torch.equal(tensor.view(torch.uint8), before):
                return f"{self.name} side pool tensor {index} changed although no transfer names the side pool"
        return ""


def build_side(mods: Any, case: Case, name: str, anchor_host: Any, dtype: torch.dtype, device: torch.device,
               start: int, target: int) -> SidePool:
    """The side pool `name` beside `anchor_host`, with the anchor's layout, page size and target layers."""
    size, ps = case.device_rows - case.page_size, case.page_size
    if name == K_ONLY:
        device_pool = mods.MHATokenToKOnlyPool(size, ps, dtype, 1, SIDE_HEAD_DIM, target, str(device), False,
                                               start_layer=start, end_layer=start + target)
        host_pool = mods.mha.MHATokenToKOnlyPoolHost(device_pool, anchor_host, case.layout.value, True, "cpu",
                                                     "default")
        return SidePool(name, device_pool, host_pool, [host_pool.k_buffer], list(device_pool.k_buffer))
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    state = torch.zeros((target, case.device_rows, 1, SIDE_HEAD_DIM), dtype=dtype, device=device)
    info = MambaStateBufferInfo(temporal=state, conv=(state.clone(),))
    host_pool = MambaPoolHost(info, 2.0, 0, device_capacity=size, pin_memory=True, device="cpu",
                              allocator_type="default", layout=case.layout.value)
    device_pool = mamba.DevicePoolStandIn(info, target, device, start)
    return SidePool(name, device_pool, host_pool, [host_pool.temporal_buffer, host_pool.conv_buffer[0]],
                    [info.temporal, info.conv[0]])


def side_entry(mods: Any, side: SidePool, target: int) -> Any:
    """The side pool's group entry, through sglang's own builder (stage-local layer mapping)."""
    pool_name = mods.PoolName.INDEXER if side.name == K_ONLY else mods.PoolName.MAMBA
    return mods.build_pool_entry(name=pool_name, host_pool=side.host_pool, device_pool=side.device_pool,
                                 layer_mapping={layer: layer for layer in range(target)},
                                 transfer_layer_id_max=target, is_anchor=False)
