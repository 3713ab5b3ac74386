"""Fake MLA host pool."""

from sglang.srt.mem_cache.pool_host.base import HostPool


class MLATokenToKVPoolHost(HostPool):
    components = ("kv",)
