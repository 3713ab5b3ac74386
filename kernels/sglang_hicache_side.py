"""Side pools of the hybrid controller's group for ``sglang-hicache``: pools beside the anchor (a K-only index pool, a
Mamba state pool, or both), which move with the anchor's transfers where the case's ``side_transfer`` knob says so,
else no transfer names them.

sglang's HostPoolGroup derives its capability flags from every child (``can_use_write_back_jit``: all of them,
``supports_per_pool_backup_indices``: any of them), and the HybridCacheController places the back-up indices by
those flags before it asks each pool. A side pool whose flag disagrees with the anchor's therefore changes the
path the anchor's own transfer takes, although the side pool moves nothing (no ``extra_pools`` are given). The
side pool is built through its own constructor, as sglang's assembler builds it: a K-only index pool
(``MHATokenToKOnlyPoolHost`` over an ``MHATokenToKOnlyPool``, sized from the anchor host pool, ``PoolName.INDEXER``)
or a Mamba state pool (``MambaPoolHost``, ``PoolName.MAMBA``). What must hold (docs/semantics.md, 9.3): its bytes
after the sequence are the bytes before it.

With ``side_transfer`` the drive names the side pool in each transfer's ``extra_pools`` (a back-up: its device rows,
its host slots left to the group's ``resolve_host_transfers``; a load: the slots that back-up was granted) and
releases an evicted entry's slots through the group's ``release_transfers``. Its bytes after each step must then be
the oracle's (oracles/side_transfers.py): the bytes before the sequence with the side steps' copies applied. Its
host pool has as many slots as the anchor's (the K-only pool takes the anchor's size; the Mamba pool's ratio is
chosen for it), which the oracle's side allocator assumes. With two side pools every transfer names both, each
granted by its own allocator; under ``side_transfer=full`` the one asked last starts with most of its slots held
(``hold_outside``), so that it refuses the back-ups the oracle plans as refused.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention, Case, PoolSpec
from hicache_fuzz.kernels import sglang_hicache_mamba as mamba
from hicache_fuzz.oracles import side_transfers

K_ONLY = "MHATokenToKOnlyPoolHost"
# The side pools' own rows (bytes): one head of 8 elements of the anchor's dtype; any width does (nothing moves).
SIDE_HEAD_DIM = 8


class SidePool:
    """A side pool's device and host objects, and its tensors: their bytes one after another are the side pool's
    host and device storages of the oracle's side case (oracles/side_transfers.py, ``side_case``)."""

    def __init__(self, name: str, device_pool: Any, host_pool: Any, host: list[torch.Tensor],
                 device: list[torch.Tensor], case: Case, layers: int) -> None:
        self.name, self.device_pool, self.host_pool = name, device_pool, host_pool
        self.position = 0  # its place among the group's side pools, in name order (the oracle's side steps)
        self.host, self.device, self.tensors = host, device, host + device
        self.before: list[torch.Tensor] = []
        self.case = side_transfers.side_case(case, side_spec(case, name), layers)
        self.expected_host = torch.empty(0, dtype=torch.uint8)  # the oracle's storages, set by fill_and_snapshot
        self.expected_device = torch.empty(0, dtype=torch.uint8)

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
        # the bytes put in are the oracle's starting storages: the input, not a result read back
        self.expected_host = _flat(self.before[: len(self.host)])
        self.expected_device = _flat(self.before[len(self.host) :])

    def apply(self, step: side_transfers.SideStep) -> None:
        """The oracle's copies of `step` on the expected storages."""
        side_transfers.apply_side_step(self.case, self.expected_host, self.expected_device, step, self.position)

    def hold_outside(self, case: Case, pools: int) -> None:
        """The side allocator as the oracle's starts (oracles/side_transfers.py): every slot free, ascending, then
        the slots entries outside the sequence hold granted to them (one grant of the first ones, never freed)."""
        self.host_pool.clear()
        held = side_transfers.held_outside(case, pools, self.position)
        if held and self.host_pool.alloc(held) is None:
            raise AssertionError(f"the {self.name} side pool's allocator refused {held} of its "
                                 f"{self.host_pool.size} slots, all of them free")

    def differs(self) -> str:
        """'' if the side pool's host and device bytes are the oracle's expected storages, else the first
        difference."""
        for where, tensors, expected in (("host", self.host, self.expected_host),
                                         ("device", self.device, self.expected_device)):
            got = _flat([t.view(torch.uint8) for t in tensors])
            if got.numel() != expected.numel():
                raise RuntimeError(f"harness: the {self.name} side pool's {where} tensors hold {got.numel()} bytes, "
                                   f"the oracle's side storage {expected.numel()}")
            bad = (got != expected).nonzero()
            if len(bad):
                return (f"{self.name} side pool {where} bytes differ from the oracle's in {len(bad)} bytes, the first "
                        f"at byte {int(bad[0])} of its {where} storage")
        return ""

    def changed(self) -> str:
        """'' if every tensor holds its snapshot's bytes, else which one does not."""
        for index, (tensor, before) in enumerate(zip(self.tensors, self.before, strict=True)):
            if not torch.equal(tensor.view(torch.uint8), before):
                return f"{self.name} side pool tensor {index} changed although no transfer names the side pool"
        return ""


def side_spec(case: Case, name: str) -> PoolSpec:
    """The side pool's rows in the oracle's terms: one head of SIDE_HEAD_DIM elements of the anchor's dtype, one
    component for the K-only pool (a latent-style row), two (temporal and conv state) for the Mamba pool."""
    attention = Attention.MLA if name == K_ONLY else Attention.MHA
    return PoolSpec("side", attention, case.pools[0].dtype, 1, SIDE_HEAD_DIM)


def build_side(mods: Any, case: Case, name: str, anchor_host: Any, dtype: torch.dtype, device: torch.device,
               start: int, target: int, moves: bool = False) -> SidePool:
    """The side pool `name` beside `anchor_host`, with the anchor's layout, page size and target layers. A side
    pool that `moves` has the anchor's host capacity (the oracle's side allocator assumes it)."""
    size, ps = case.device_rows - case.page_size, case.page_size
    if name == K_ONLY:
        device_pool = mods.MHATokenToKOnlyPool(size, ps, dtype, 1, SIDE_HEAD_DIM, target, str(device), False,
                                               start_layer=start, end_layer=start + target)
        host_pool = mods.mha.MHATokenToKOnlyPoolHost(device_pool, anchor_host, case.layout.value, True, "cpu",
                                                     "default")
        side = SidePool(name, device_pool, host_pool, [host_pool.k_buffer], list(device_pool.k_buffer), case,
                        target)
    else:
        from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
        from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

        state = torch.zeros((target, case.device_rows, 1, SIDE_HEAD_DIM), dtype=dtype, device=device)
        info = MambaStateBufferInfo(temporal=state, conv=(state.clone(),))
        # sized int(capacity * ratio) + 1 slots: this ratio gives the anchor's host_slots (the half slot keeps float
        # rounding below the next integer)
        ratio = (case.host_slots - 0.5) / size if moves else 2.0
        host_pool = MambaPoolHost(info, ratio, 0, device_capacity=size, pin_memory=True, device="cpu",
                                  allocator_type="default", layout=case.layout.value)
        device_pool = mamba.DevicePoolStandIn(info, target, device, start)
        side = SidePool(name, device_pool, host_pool, [host_pool.temporal_buffer, host_pool.conv_buffer[0]],
                        [info.temporal, info.conv[0]], case, target)
    if moves and side.host_pool.size != case.host_slots:
        raise RuntimeError(f"harness: the {name} side pool was built with {side.host_pool.size} host slots, the "
                           f"anchor's {case.host_slots}")
    return side


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The bytes of `tensors` one after another, on the CPU."""
    return torch.cat([t.reshape(-1).cpu() for t in tensors]) if tensors else torch.empty(0, dtype=torch.uint8)


def build_sides(mods: Any, case: Case, names: tuple[str, ...], anchor_host: Any, dtype: torch.dtype,
                device: torch.device, start: int, target: int, moves: bool = False) -> list[SidePool]:
    """The side pools `names` (in the group's name order) beside `anchor_host`, each knowing its place."""
    sides = []
    for position, name in enumerate(names):
        side = build_side(mods, case, name, anchor_host, dtype, device, start, target, moves)
        side.position = position
        sides.append(side)
    return sides


def pool_name(mods: Any, side: SidePool) -> Any:
    """The side pool's name in the group (and in the transfers that name it)."""
    return mods.PoolName.INDEXER if side.name == K_ONLY else mods.PoolName.MAMBA


def side_entry(mods: Any, side: SidePool, target: int) -> Any:
    """The side pool's group entry, through sglang's own builder (stage-local layer mapping)."""
    return mods.build_pool_entry(name=pool_name(mods, side), host_pool=side.host_pool, device_pool=side.device_pool,
                                 layer_mapping={layer: layer for layer in range(target)},
                                 transfer_layer_id_max=target, is_anchor=False)
