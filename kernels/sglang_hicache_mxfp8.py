"""``MHATokenToKVPoolMXFP8Host`` for ``sglang-hicache``: the MXFP8 block-scaled MHA KV cache's host pool, built as
sglang builds it over sglang's own ``MHATokenToKVPoolMXFP8`` device pool, and its UE8M0 scale blocks judged by the
oracle after every transfer.

What the case describes: the pool's fp8 K/V payload, an MHA pool of E-byte rows in the page_first layout at page
size 128 (oracles/pool_layouts.py, the class's entry). A row of E bytes is E fp8 elements, whatever the case's dtype
(every transfer copies opaque bytes), split into the case's heads where their head dim is a multiple of 32 (whole
scale blocks), else into one head: the payload's bytes and the scale blocks' sizes are the same for every split.
The runner compares its storages as every case's.

What the case does not describe: the scale blocks, which live beside the payload (per layer and component one
interleaved tensor on the device, one page-major tensor per component on the host) while a case holds one device
and one host storage per pool, all of one layout. The oracle reads them as a pool of its own (pool_layouts' MXFP8
section, ``mxfp8_scale_case``: a page_first_direct MHA pool of E / 32-byte rows moved by page ids), and they are
judged here: filled with a pattern before the sequence (a byte counting up, differently in each tensor), then
compared byte for byte with what the oracle computes for the scale case after every transfer (where the sequence's
step images fit their budget; else after the last one, as the payload is). A difference fails the case naming the
step, the component, the side and the page and layer of the first differing byte; like the DSA indexer's anchor
and tail pages it is reported as a rejection (``valid input rejected``), since the runner compares only the case's
own storages.

No stand-in: ``MHATokenToKVPoolMXFP8``'s constructor takes a KV pool's arguments (size, page size, dtype, heads,
head dim, layers, device, layer range) and needs no model configuration, so the device pool is sglang's own, and
its ``MHABufferInfo`` (interleaved ``KVScaleLayout.MXFP8_INTERLEAVED`` scales) is what sglang's
``get_mha_host_pool_cls`` picks the host pool class from; that class is built through its own constructor with the
arguments ``build_kv_host_pool`` passes (the harness' capacity as ``host_token_capacity``, as for every MHA case).

Hardware: sglang's server refuses ``--kv-cache-dtype mxfp8`` below SM100 (``handle_mxfp8_kv_cache_compatibility``:
the block-scaled operands of FA4's MXFP8 attention). Nothing this backend runs needs that *(by reading)*: the
device pool allocates fp8 and float8_e8m0fnu tensors, and the host pool moves bytes with the staged write-back and
the JIT one-layer kernels (TMA on sm90+, else the register kernel), the modules every page_first pool uses on an
H100 or H200; so MXFP8 cases run there. The device pool's one requirement beyond a KV pool's is torch's
float8_e8m0fnu dtype: a torch without it makes MXFP8 cases unsupported with that reason (``torch_unsupported``).
"""

from __future__ import annotations

from typing import Any

import torch

from hicache_fuzz.harness.model.case import Case, PoolSpec
from hicache_fuzz.kernels.sglang_hicache_settings import MXFP8_CLASS, case_settings
from hicache_fuzz.oracles import pool_layouts, sequence
from hicache_fuzz.oracles.transfer import storage_key

MXFP8 = MXFP8_CLASS
COMPONENTS = ("k", "v")


def torch_unsupported(case: Case) -> str | None:
    """Why this torch cannot build the case's MXFP8 device pool (None: it can, or the case is of another class)."""
    if case_settings(case)[0] != MXFP8 or hasattr(torch, "float8_e8m0fnu"):
        return None
    return f"{MXFP8}: MHATokenToKVPoolMXFP8 stores its scales as torch.float8_e8m0fnu, which this torch lacks"


def heads_split(spec: PoolSpec) -> tuple[int, int]:
    """(heads, head dim) in fp8 elements of the case's row: the case's heads where that head dim is a multiple of
    the 32-element scale block, else one head (rows are multiples of 32 bytes: pool_layouts' row rule)."""
    row = spec.row_bytes("k")
    heads = spec.heads if (row // spec.heads) % pool_layouts.MXFP8_BLOCK == 0 else 1
    return heads, row // heads


def build_mxfp8(case: Case, device: torch.device, start: int) -> tuple[Any, Any]:
    """(device pool, host pool) of an MXFP8 case: sglang's ``MHATokenToKVPoolMXFP8`` over the case's stage, then
    the host pool class sglang picks for its buffer info, through that class's own constructor."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolMXFP8
    from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

    spec, ps, layers = case.pools[0], case.page_size, case.layers
    heads, head_dim = heads_split(spec)
    size, end = case.device_rows - ps, start + layers  # exclusive end, as the model runner's layer ranges are
    device_pool = MHATokenToKVPoolMXFP8(size, ps, torch.float8_e4m3fn, heads, head_dim, layers, str(device), False,
                                        start_layer=start, end_layer=end, enable_alt_stream=False)
    info = device_pool.get_device_pool_infos()[0].buffer_info
    cls = get_mha_host_pool_cls(info)
    if cls.__name__ != MXFP8:
        raise RuntimeError(f"harness: sglang picks {cls.__name__} for MHATokenToKVPoolMXFP8's buffer info, not {MXFP8}")
    host_pool = cls(info, 2.0, 0, ps, case.layout.value, True, "cpu", "default", device_capacity_tokens=size,
                    start_layer=start, end_layer=end, draft_buffer_infos=(),
                    write_back_staging=device_pool.hicache_write_back_staging, pool_label=spec.name,
                    host_token_capacity=case.host_slots)
    return device_pool, host_pool


def _pattern(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A byte counting up by 7 modulo 251 from `offset`: a block moved to another page, layer or tensor differs."""
    count = torch.arange(tensor.numel(), device=tensor.device)
    return ((count * 7 + offset) % 251).to(torch.uint8)


class ScaleStorages:
    """The MXFP8 pool's scale tensors as the storages of the scale case (``pool_layouts.mxfp8_scale_case``), and
    what the oracle expects of them after each transfer of the case's sequence. Built for one geometry; the case
    (index lists, program) is the one last given to ``fill_and_expect``, as the pool's objects serve every case of
    their geometry."""

    def __init__(self, case: Case, device_pool: Any, host_pool: Any) -> None:
        self.case = pool_layouts.mxfp8_scale_case(case)
        scales = device_pool.get_device_pool_infos()[0].buffer_info.scales
        self.device = {"k": list(scales.k), "v": list(scales.v)}
        self.host = {"k": host_pool.k_scale_host, "v": host_pool.v_scale_host}
        spec = case.pools[0]
        heads, head_dim = heads_split(spec)
        row = spec.row_bytes("k")
        self.block = pool_layouts.mxfp8_scale_page_bytes(row)
        want_device = pool_layouts.mxfp8_device_scale_shape(case.device_rows, heads, head_dim)
        want_host = pool_layouts.mxfp8_host_scale_shape(case.host_slots, case.layers, row)
        for component in COMPONENTS:
            layers = self.device[component]
            shapes = {tuple(t.shape) for t in layers}
            if len(layers) != case.layers or shapes != {want_device}:
                raise RuntimeError(f"harness: sglang's {component.upper()} device scales are {len(layers)} x "
                                   f"{sorted(shapes)}, the oracle's {case.layers} x {want_device}")
            if tuple(self.host[component].shape) != want_host:
                raise RuntimeError(f"harness: sglang's {component.upper()} host scales are "
                                   f"{tuple(self.host[component].shape)}, the oracle's {want_host}")
        name = self.case.pools[0].name
        self.keys = {"device": storage_key(name, "device"), "host": storage_key(name, "host")}
        self.expected: list[dict[str, torch.Tensor]] = []  # after each transfer (empty: the last one only)
        self.final: dict[str, torch.Tensor] = {}
        self.checked = 0

    def tensors(self) -> list[torch.Tensor]:
        """Every scale tensor, in the order of the scale case's storages: device K layers, device V layers, host K,
        host V."""
        return [*self.device["k"], *self.device["v"], self.host["k"], self.host["v"]]

    def storages(self) -> dict[str, torch.Tensor]:
        """CPU copies of the scale bytes as the scale case's device and host storages."""
        def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat([t.view(torch.uint8).reshape(-1).cpu() for t in tensors])

        return {self.keys["device"]: flat([*self.device["k"], *self.device["v"]]),
                self.keys["host"]: flat([self.host["k"], self.host["v"]])}

    def fill_and_expect(self, case: Case, per_step: bool) -> None:
        """Fill every scale tensor with its pattern, then compute what the oracle expects after each transfer of
        `case`'s sequence (`per_step`) or after the last."""
        self.case = pool_layouts.mxfp8_scale_case(case)
        for index, tensor in enumerate(self.tensors()):
            flat = tensor.view(torch.uint8).view(-1)
            flat.copy_(_pattern(flat, 31 * index))
        payloads = self.storages()
        images: list[dict[str, torch.Tensor]] = []

        def record(_step: sequence.Step) -> None:
            images.append({key: value.clone() for key, value in payloads.items()})

        sequence.apply_sequence(self.case, payloads, pool_layouts.MXFP8_SCALE_SEMANTICS, record if per_step else None)
        self.expected, self.final, self.checked = images, payloads, 0

    def check_step(self) -> str:
        """'' if the scales hold what the oracle expects after the next transfer of the sequence (or per-step
        checks are off), else what differs."""
        if not self.expected:
            return ""
        want = self.expected[self.checked]
        self.checked += 1
        return self._difference(want)

    def check_final(self) -> str:
        """'' if the scales hold what the oracle expects after the whole sequence, else what differs."""
        return self._difference(self.final)

    def _difference(self, want: dict[str, torch.Tensor]) -> str:
        actual = self.storages()
        for side, key in self.keys.items():
            if torch.equal(actual[key], want[key]):
                continue
            differs = (actual[key] != want[key]).nonzero().flatten()
            return f"{MXFP8} {self._where(side, int(differs[0]))}, {len(differs)} bytes differ from the oracle's"
        return ""

    def _where(self, side: str, index: int) -> str:
        """Component, side, page and layer of byte `index` of a scale storage (K tensors, then V tensors)."""
        layers = self.case.layers
        pages = (self.case.device_rows if side == "device" else self.case.host_slots) // self.case.page_size
        half = layers * pages * self.block
        component, offset = COMPONENTS[index // half], index % half
        if side == "device":  # layer after layer, each (pages, block)
            layer, page = offset // (pages * self.block), offset // self.block % pages
        else:  # (pages, layers, block)
            page, layer = offset // (layers * self.block), offset // self.block % layers
        return (f"{component.upper()} scale {side} block (page {page}, layer {layer}) byte {offset % self.block} "
                f"of {self.block}")
