"""hicache-fuzz's adapter for sglang's staged HiCache tests (this file is ours, not sglang's; stage_sglang_tests.py
copies it next to them as conftest.py).

The staged test_hicache.py builds its host pools the way sglang did before 0.5.23's host-pool constructor change:
`MHATokenToKVPoolHost(device_pool=..., host_to_device_ratio=..., host_size=..., page_size=..., layout=..., ...)`.
sglang 0.5.23 takes the device pool's buffer description instead (`buffer_info`, plus `device_capacity_tokens`,
`start_layer`, `end_layer`, and `target_layer_num` for MLA), as its own assembler
(`hybrid_pool_assembler.build_kv_host_pool`) and this harness's sglang-pool backend pass them. This adapter
accepts the old keyword and translates it, so those tests run against 0.5.23 with their assertions unchanged; a
call without `device_pool=` is passed through untouched. If anything here fails, nothing is adapted (the tests
then fail as written, and the prerun deselects and lists them).
"""

from __future__ import annotations

import functools
from typing import Any


def _adapt(cls: Any, mla: bool) -> None:
    original = cls.__init__
    if getattr(original, "_hicache_fuzz_adapter", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, device_pool: Any = None, **kwargs: Any) -> None:
        if device_pool is None or args:
            original(self, *args, **kwargs)
            return
        info = device_pool.get_device_pool_infos()[0].buffer_info
        capacity = getattr(device_pool, "host_capacity_tokens", None)
        extra: dict[str, Any] = {
            "device_capacity_tokens": device_pool.size if capacity is None else capacity,
            "start_layer": device_pool.start_layer,
            "end_layer": device_pool.end_layer,
        }
        if mla:
            extra["target_layer_num"] = device_pool.layer_num
        elif getattr(device_pool, "hicache_write_back_staging", None) is not None:
            extra["write_back_staging"] = device_pool.hicache_write_back_staging
        positional = [kwargs.pop(name) for name in ("host_to_device_ratio", "host_size", "page_size", "layout")]
        original(self, info, *positional, **kwargs, **extra)

    __init__._hicache_fuzz_adapter = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


try:
    from sglang.srt.mem_cache.pool_host import mha as _mha
    from sglang.srt.mem_cache.pool_host import mla as _mla

    _adapt(_mha.MHATokenToKVPoolHost, mla=False)
    _adapt(_mla.MLATokenToKVPoolHost, mla=True)
except Exception as _exc:  # never break collection: the tests then run (and fail) as written
    print(f"hicache-fuzz conftest: host-pool adapter not installed ({type(_exc).__name__}: {_exc})")
