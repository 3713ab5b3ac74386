"""Fake MHA host pool."""

from sglang.srt.mem_cache.pool_host.base import HostPool


class MHATokenToKVPoolHost(HostPool):
    components = ("k", "v")
