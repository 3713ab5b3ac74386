"""The sglang call of a standalone reproducer for ``sglang-page-unified``: sglang's page_unified host pool of each
pool (its own constructor, over a device pool of one page), the check of its layout's L3 chunk spans against the
oracle's, the case's host bytes copied into the pool's buffer, the kernel calls on it, and the bytes copied back for
the comparison. Everything handed to sglang is printed from the definitions ``kernels/sglang_page_unified.py`` runs:
``pool_construction`` (kernels/sglang_pool_calls.py), ``span_probes`` and the backend's ``sglang_calls``.
"""

from __future__ import annotations

from hicache_fuzz.harness.findings.standalone_pool import class_imports
from hicache_fuzz.harness.model.case import Case
from hicache_fuzz.kernels.sglang_page_unified import SglangPageUnifiedBackend, span_probes
from hicache_fuzz.kernels.sglang_pool_calls import BUFFER_INFO, pool_construction
from hicache_fuzz.oracles.contract import Platform


def page_unified_call(case: Case, platform: Platform) -> str:
    built = [(spec, pool_construction(case, spec, device_size=case.page_size)) for spec in case.pools]
    lines = [
        "from sglang.kernels.ops.kvcache import hicache",
        *class_imports(made for _, made in built),
        "",
        "# sglang's page_unified host pool of each pool: its kv_buffer is the host tensor the kernels take (the device",
        "# pool of one page only describes its rows to the constructor; the kernels move the case's device layers)",
        "host_pools = {}",
    ]
    for spec, made in built:
        lines += [*made.device_pool.source("device_pool"),
                  *made.host_pool.source(f'host_pools["{spec.name}"]', BUFFER_INFO)]
    lines += ["# the oracle's L3 chunk span of each layer range and head group: (offset, length) within a page block,",
              "# None where the range names no chunk (sglang must refuse it with ValueError)",
              "SPANS = {"]
    for spec, _ in built:
        lines += [f'    "{spec.name}": [',
                  *(f"        ({probe.layers}, {probe.group}, {probe.want})," for probe in span_probes(case, spec)),
                  "    ],"]
    lines += [
        "}",
        "for name, spans in SPANS.items():",
        "    for layers, group, want in spans:",
        "        try:",
        "            got = tuple(host_pools[name].page_unified_layout.chunk_span(layers, group))",
        "        except ValueError:",
        "            got = None",
        "        if got != want:",
        '            raise AssertionError(f"{name}: PageUnifiedLayout.chunk_span({layers}, {group}) gave {got}, "',
        '                                 f"the oracle {want}")',
        "for name, host_pool in host_pools.items():  # the case's host bytes into sglang's host buffer",
        '    host_pool.kv_buffer.view(torch.uint8).view(-1).copy_(payload(raw, name, "host"))',
        "try:",
        *(f"    {line}" for call in SglangPageUnifiedBackend().sglang_calls(case, platform)
          for line in call.source().splitlines()),
        "finally:",
        '    if DEVICE.type == "cuda":',
        "        torch.cuda.synchronize()",
        "    for name, host_pool in host_pools.items():  # the bytes back for the comparison; unpin sglang's buffer",
        '        payload(raw, name, "host").copy_(host_pool.kv_buffer.view(torch.uint8).view(-1))',
        "        host_pool.destroy()",
    ]
    return "\n".join(lines)
