"""Fake device KV pools: per-layer buffers of size + page_size rows (rows [0, page_size) are padding).

Same constructor signatures as sglang's (the arguments the harness passes); ``get_device_pool_infos`` hands the
MHA pools themselves as their buffer info, which the fake host pools read (an MHA pool's ``scales``: None, or the
MXFP8 pool's UE8M0 scale buffers), and the MLA pool sglang's ``MLABufferInfo``: the owned range's layers where the
pool is layer-sharded (``layer_shard_enabled`` and ``_owned_local_layer_range``, which sglang's layer-split DSA
pool defines). ``_create_buffers`` makes the per-layer buffers, as sglang's; the unified pools override it with
their views (unified_memory_pool.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch


class _DevicePool:
    layer_transfer_counter: Any = None
    layer_shard_enabled = False

    def _init_common(self, size: int, page_size: int, dtype: torch.dtype, layer_num: int, device: str,
                     start_layer: int | None, end_layer: int | None) -> None:
        self.size, self.page_size, self.dtype, self.layer_num = size, page_size, dtype, layer_num
        self.store_dtype = dtype
        self.device = torch.device(device)
        self.start_layer = start_layer or 0
        self.end_layer = end_layer if end_layer is not None else self.start_layer + layer_num - 1

    def get_device_pool_infos(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(buffer_info=self)]

    def register_layer_transfer_counter(self, counter: Any) -> None:
        self.layer_transfer_counter = counter

    def host_pool_decls(self) -> tuple[Any, ...]:
        from sglang.srt.mem_cache.pool_host.host_pool_decl import make_kv_pool_decl

        return (make_kv_pool_decl(self),)


class MHATokenToKVPool(_DevicePool):
    hicache_write_back_staging: Any = None
    scales: Any = None

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int,
                 device: str, enable_memory_saver: bool, v_head_dim: int | None = None,
                 start_layer: int | None = None, end_layer: int | None = None,
                 enable_alt_stream: bool = True) -> None:
        self._init_common(size, page_size, dtype, layer_num, device, start_layer, end_layer)
        self.head_num, self.head_dim = head_num, head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self._create_buffers()
        self.row_bytes = head_num * head_dim * self.k_buffer[0].element_size()

    def _create_buffers(self) -> None:
        rows = self.size + self.page_size
        self.k_buffer = [torch.zeros((rows, self.head_num, self.head_dim), dtype=self.dtype, device=self.device)
                         for _ in range(self.layer_num)]
        self.v_buffer = [torch.zeros((rows, self.head_num, self.v_head_dim), dtype=self.dtype, device=self.device)
                         for _ in range(self.layer_num)]


class MHATokenToKVPoolMXFP8(MHATokenToKVPool):
    """fp8 K/V rows and one UE8M0 scale byte per 32 elements beside them: at page size 128 in FA4's interleaved
    layout (pages, heads, 32, page_size // 32, head_dim // 32) per layer, else one row of scales per slot (sglang's
    shapes and head dim rule)."""

    BLOCK = 32

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int,
                 device: str, enable_memory_saver: bool, v_head_dim: int | None = None,
                 start_layer: int | None = None, end_layer: int | None = None,
                 enable_alt_stream: bool = True) -> None:
        v_dim = head_dim if v_head_dim is None else v_head_dim
        for name, dim in (("head_dim", head_dim), ("v_head_dim", v_dim)):
            if dim % self.BLOCK:
                raise ValueError(f"MXFP8 KV cache requires {name} divisible by {self.BLOCK}, got {dim}.")
        super().__init__(size, page_size, torch.float8_e4m3fn, head_num, head_dim, layer_num, device,
                         enable_memory_saver, v_head_dim=v_head_dim, start_layer=start_layer, end_layer=end_layer,
                         enable_alt_stream=enable_alt_stream)
        from sglang.srt.mem_cache.device_pool_info import KVScaleBuffers, KVScaleLayout

        rows = size + page_size
        interleaved = page_size == 128

        def shape(dim: int) -> tuple[int, ...]:
            if interleaved:
                return (rows // page_size, head_num, self.BLOCK, page_size // self.BLOCK, dim // self.BLOCK)
            return (rows, head_num, dim // self.BLOCK)

        self.k_scale_buffer = [torch.zeros(shape(head_dim), dtype=torch.float8_e8m0fnu, device=device)
                               for _ in range(layer_num)]
        self.v_scale_buffer = [torch.zeros(shape(self.v_head_dim), dtype=torch.float8_e8m0fnu, device=device)
                               for _ in range(layer_num)]
        self.scales = KVScaleBuffers(k=tuple(self.k_scale_buffer), v=tuple(self.v_scale_buffer),
                                     layout=KVScaleLayout.MXFP8_INTERLEAVED if interleaved else KVScaleLayout.TOKEN)


class MLATokenToKVPool(_DevicePool):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str, enable_memory_saver: bool, start_layer: int | None = None,
                 end_layer: int | None = None) -> None:
        self._init_common(size, page_size, dtype, layer_num, device, start_layer, end_layer)
        width = kv_lora_rank + qk_rope_head_dim
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.head_num, self.head_dim, self.kv_cache_dim = 1, width, width
        self._create_buffers()
        self.data_ptrs = torch.tensor([x.data_ptr() for x in self.kv_buffer], dtype=torch.uint64)
        self.row_bytes = width * self.kv_buffer[0].element_size()

    def _create_buffers(self) -> None:
        self.kv_buffer = [torch.zeros((self.size + self.page_size, 1, self.kv_cache_dim), dtype=self.store_dtype,
                                      device=self.device) for _ in range(self.layer_num)]

    def get_device_pool_infos(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(buffer_info=self._mla_buffer_info())]

    def _mla_buffer_info(self) -> Any:
        from sglang.srt.mem_cache.device_pool_info import MLABufferInfo

        start, end = self._owned_local_layer_range() if self.layer_shard_enabled else (0, self.layer_num)
        return MLABufferInfo(buffers=tuple(self.kv_buffer[start:end]), data_ptrs=self.data_ptrs[start:end],
                             layer_indices=tuple(range(start, end)), device_layer_num=self.layer_num,
                             page_size=self.page_size, kv_lora_rank=self.kv_lora_rank,
                             qk_rope_head_dim=self.qk_rope_head_dim, kv_cache_dim=self.kv_cache_dim,
                             dtype=self.store_dtype, device=self.device)


class MHATokenToKOnlyPool(_DevicePool):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int,
                 device: str, enable_memory_saver: bool, start_layer: int | None = None,
                 end_layer: int | None = None) -> None:
        self._init_common(size, page_size, dtype, layer_num, device, start_layer, end_layer)
        self.head_num, self.head_dim, self.store_dtype = head_num, head_dim, dtype
        self.k_buffer = [torch.zeros((size + page_size, head_num, head_dim), dtype=dtype, device=device)
                         for _ in range(layer_num)]

    def get_device_pool_infos(self) -> list[SimpleNamespace]:
        # as sglang's: this class has no device pool provider (its host pool is built over the pool itself)
        raise NotImplementedError(f"{type(self).__name__} has no device pool provider")


class DSATokenToKVPool(MLATokenToKVPool):
    """Only the class attribute the DSA indexer's declaration reads: the harness stands in for the pool itself."""

    index_k_with_scale_buffer_dtype = torch.uint8

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("fake sglang: DSATokenToKVPool needs a model's DSA configuration")
