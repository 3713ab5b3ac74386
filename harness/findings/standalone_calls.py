"""The sglang call of a standalone reproducer, per backend: the few lines of Python that hand the case's
tensors to sglang exactly as the backend in ``kernels/sglang_<kind>.py`` does.

Each template returns the body of ``call_sglang(raw, host_idx, dev_idx)`` in the generated script (see
:mod:`hicache_fuzz.harness.findings.standalone`), which has these names in scope: ``typed(raw, pool, side)`` (the
payload in sglang's shape: device ``(K/V, layer, row, head, dim)``, host in the pool's host layout),
``ptrs(tensors)`` (a uint64 device table of base addresses), ``DEVICE``, ``torch``, ``os``.

The templates are keyed by backend name (``CALLS``). A backend outside this table gets no standalone script.
Note for the restructure: these could become a ``standalone_call(case) -> str`` method of each sglang
backend; they are kept here, next to the assembler, so a merge touches no backend file.
"""

from __future__ import annotations

from collections.abc import Callable

from hicache_fuzz.harness.findings.standalone_pool import pool_call
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostLayout, Scope
from hicache_fuzz.kernels import sglang_common
from hicache_fuzz.oracles.contract import Platform


def _mla(case: Case) -> bool:
    return case.pools[0].attention is Attention.MLA


def _row(case: Case) -> int:
    pool = case.pools[0]
    return pool.row_bytes(pool.components[0])


def _host_layer(case: Case, pool: str, component: int | str | None, layer: str) -> str:
    """sglang's per-layer host view: (slots, heads, dim), strided for page_first."""
    whole = f'typed(raw, "{pool}", "host")' + ("" if component is None else f"[{component}]")
    return f"{whole}[{layer}]" if case.layout is HostLayout.LAYER_FIRST else f"{whole}[:, {layer}]"


# ---- JIT register / TMA -------------------------------------------------------------------------------------

def _jit(case: Case, platform: Platform, tma_mode: str | None) -> str:
    lines = ["from sglang.kernels.ops.kvcache import hicache", ""]
    if tma_mode is None:
        lines.insert(0, f"# sglang's own TMA gate decides: {sglang_common.TMA_ENV} as in your environment (unset: on)")
    if tma_mode is not None:
        value = "0" if tma_mode == "off" else "1"
        what = "off: the register kernel" if tma_mode == "off" else "on (the row/page rule still applies)"
        lines = [f'os.environ["{sglang_common.TMA_ENV}"] = "{value}"  # TMA gate {what}; read at the first call',
                 *lines]
    page_size = case.page_size
    if tma_mode == "on" and not case.tuning_value("tma_page_size", True):
        page_size_text = "None  # no page size: the TMA gate trusts the indices"
    else:
        page_size_text = str(page_size)
    write = case.direction is Direction.WRITE_BACK
    idx = "idx_dst, idx_src = (host_idx, dev_idx)" if write else "idx_dst, idx_src = (dev_idx, host_idx)"
    lines += [f"page_size = {page_size_text}", idx]
    pool = case.pools[0].name
    row = _row(case)
    element_dim = row // case.pools[0].dtype.itemsize
    mla = _mla(case)
    if case.scope is Scope.ONE_LAYER:
        layer = case.layer
        if mla:
            lines += [f'dev = typed(raw, "{pool}", "device")[0, {layer}]',
                      f"host = {_host_layer(case, pool, None, str(layer))}",
                      "dst, src = " + ("(host, dev)" if write else "(dev, host)"),
                      f"hicache.transfer_hicache_one_layer_mla(dst, idx_dst, src, idx_src, element_dim={element_dim}, "
                      "page_size=page_size)"]
        else:
            lines += [f'dev = typed(raw, "{pool}", "device")[:, {layer}]  # K and V rows of layer {layer}',
                      f"k_host, v_host = {_host_layer(case, pool, 0, str(layer))}, "
                      f"{_host_layer(case, pool, 1, str(layer))}",
                      "(k_dst, v_dst), (k_src, v_src) = " + ("((k_host, v_host), (dev[0], dev[1]))" if write
                                                               else "((dev[0], dev[1]), (k_host, v_host))"),
                      "hicache.transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k_src, v_src, idx_src, "
                      f"element_dim={element_dim}, page_size=page_size)"]
        return "\n".join(lines)
    host_stride = row if case.layout is HostLayout.LAYER_FIRST else row * case.layers
    layers = f"range({case.layers})"
    if mla:
        lines += [f'dev = ptrs(typed(raw, "{pool}", "device")[0, layer] for layer in {layers})',
                  f"host = ptrs({_host_layer(case, pool, None, 'layer')} for layer in {layers})",
                  "(dst, dst_stride), (src, src_stride) = " + (
                      f"(host, {host_stride}), (dev, {row})" if write else f"(dev, {row}), (host, {host_stride})"),
                  "hicache.transfer_hicache_all_layer_mla(dst, idx_dst, src, idx_src, "
                  "cache_src_stride_bytes=src_stride,",
                  f"                                      cache_dst_stride_bytes=dst_stride, element_size={row}, "
                  "page_size=page_size)"]
    else:
        lines += [f'dev = [ptrs(typed(raw, "{pool}", "device")[c, layer] for layer in {layers}) for c in (0, 1)]',
                  f"host = [ptrs({_host_layer(case, pool, 'c', 'layer')} for layer in {layers}) for c in (0, 1)]",
                  "(dst, dst_stride), (src, src_stride) = " + (
                      f"(host, {host_stride}), (dev, {row})" if write else f"(dev, {row}), (host, {host_stride})"),
                  "hicache.transfer_hicache_all_layer(dst[0], dst[1], idx_dst, src[0], src[1], idx_src,",
                  "                                   kv_cache_src_stride_bytes=src_stride, "
                  "kv_cache_dst_stride_bytes=dst_stride,",
                  f"                                   element_size={row}, page_size=page_size)"]
    return "\n".join(lines)


# ---- staged write-back layer_first -> page_first ------------------------------------------------------------

def _staging_tokens(case: Case, platform: Platform) -> int:
    from hicache_fuzz.kernels.sglang_staged import staging_pages

    return staging_pages(case, int(case.tuning_value("staging_pages", 0)), platform) * case.page_size


def _staged(case: Case, platform: Platform) -> str:
    tokens = _staging_tokens(case, platform)
    lines = ["from sglang.kernels.ops.kvcache import hicache", ""]
    for pool in case.pools:
        name, row = pool.name, pool.row_bytes(pool.components[0])
        if pool.attention is Attention.MLA:
            lines += [f'host = typed(raw, "{name}", "host")  # (slots, layers, 1, dim)',
                      f"staging = torch.empty(({tokens}, *host.shape[1:]), dtype=host.dtype, device=DEVICE)",
                      f'dev = ptrs(typed(raw, "{name}", "device")[0, layer] for layer in range({case.layers}))',
                      "hicache.transfer_hicache_all_layer_mla_staged_lf_pf(dev, dev_idx, host_idx, staging, host, "
                      f"page_size={case.page_size}, element_size={row})"]
        else:
            lines += [f'k_host, v_host = typed(raw, "{name}", "host")  # each (slots, layers, heads, dim)',
                      f"staging_k = torch.empty(({tokens}, *k_host.shape[1:]), dtype=k_host.dtype, device=DEVICE)",
                      "staging_v = torch.empty_like(staging_k)",
                      f'dev = [ptrs(typed(raw, "{name}", "device")[c, layer] for layer in range({case.layers})) '
                      "for c in (0, 1)]",
                      "hicache.transfer_hicache_all_layer_staged_lf_pf(dev[0], dev[1], dev_idx, host_idx, staging_k, "
                      "staging_v, k_host, v_host,",
                      f"                                               page_size={case.page_size}, element_size={row})"]
    return "\n".join(lines)


# ---- page_unified ---------------------------------------------------------------------------------------------

def _page_unified(case: Case, platform: Platform) -> str:
    lines = ["from sglang.kernels.ops.kvcache import hicache", ""]
    ps, layer = case.page_size, case.layer
    write = case.direction is Direction.WRITE_BACK
    if write:
        pages = _staging_tokens(case, platform) // ps
        lines += ["# page ids, as a caller derives them: first index of each page // page size",
                  f'src_pages = torch.div(dev_idx[::{ps}], {ps}, rounding_mode="floor").contiguous()',
                  f'dst_pages = torch.div(host_idx[::{ps}], {ps}, rounding_mode="floor").contiguous()']
    for pool in case.pools:
        name = pool.name
        mla = pool.attention is Attention.MLA
        lines.append(f'host = typed(raw, "{name}", "host")')
        if not write:
            dev = f'typed(raw, "{name}", "device")[0, {layer}]' if mla else \
                f'typed(raw, "{name}", "device")[0, {layer}], typed(raw, "{name}", "device")[1, {layer}]'
            op = f"transfer_hicache_one_layer{'_mla' if mla else ''}_page_unified_lf"
            lines.append(f"hicache.{op}({dev}, host, host_idx, dev_idx, {layer})")
            continue
        lines += [f"staging = torch.empty(({pages}, *host.shape[1:]), dtype=host.dtype, device=DEVICE)"]
        if mla:
            lines += [f'dev = ptrs(typed(raw, "{name}", "device")[0, layer] for layer in range({case.layers}))',
                      "hicache.transfer_hicache_all_layer_mla_staged_lf_page_unified(dev, src_pages, dst_pages, "
                      "staging, host)"]
        else:
            lines += [f'dev = [ptrs(typed(raw, "{name}", "device")[c, layer] for layer in range({case.layers})) '
                      "for c in (0, 1)]",
                      "hicache.transfer_hicache_all_layer_staged_lf_page_unified(dev[0], dev[1], src_pages, dst_pages, "
                      "staging, host)"]
    return "\n".join(lines)


# ---- sgl_kernel.kvcacheio AOT ops ---------------------------------------------------------------------------

# The prebuilt sgl_kernel loads only against the torch it was built for: against another its import fails
# (ImportError or OSError: an undefined torch symbol). The script cannot run the op then: exit 3 (SKIP) with
# the reason and this torch's version. An import-only stand-in's ops raise NotImplementedError naming
# themselves when called (also a SKIP).
AOT_IMPORT = [
    "try:  # the prebuilt AOT ops load only against the torch they were built for",
    "    import sgl_kernel.kvcacheio as kvcacheio",
    "except Exception as exc:",
    "    if isinstance(exc, ModuleNotFoundError) and (exc.name or '').split('.')[0] == 'sgl_kernel':",
    "        raise  # absent, not broken: the SKIP line names sgl_kernel",
    '    raise ImportError(f"sgl_kernel (the AOT ops) does not load against torch {torch.__version__}: "',
    '                      f"{type(exc).__name__}: {exc}") from exc',
]


def _aot(case: Case, platform: Platform) -> str:
    from hicache_fuzz.kernels.sglang_aot import aot_op

    pool = case.pools[0]
    name, mla, item, layout = pool.name, _mla(case), _row(case), case.layout
    op = aot_op(case)
    lines = [*AOT_IMPORT, ""]
    if case.direction is Direction.LOAD_BACK:
        layer = case.layer

        def host(c: int | None) -> str:
            if layout is HostLayout.LAYER_FIRST:
                return _host_layer(case, name, c, str(layer))
            return f'typed(raw, "{name}", "host")' + ("" if c is None else f"[{c}]")

        dev = f'typed(raw, "{name}", "device")'
        if mla:
            args = [f"src={host(None)}", f"dst={dev}[0, {layer}]"]
        else:
            args = [f"src_k={host(0)}", f"dst_k={dev}[0, {layer}]", f"src_v={host(1)}", f"dst_v={dev}[1, {layer}]"]
        args += ["src_indices=host_idx", "dst_indices=dev_idx", f"item_size={item}"]
        if layout is not HostLayout.LAYER_FIRST:
            args += [f"layer_id={layer}", f"src_layout_dim={item * case.layers}"]
    else:
        layers = f"range({case.layers})"
        lines.append(f'dev = [ptrs(typed(raw, "{name}", "device")[c, layer] for layer in {layers}) '
                     f'for c in range({len(pool.components)})]')
        if layout is HostLayout.LAYER_FIRST:
            host_layer = _host_layer(case, name, None if mla else "c", "layer")
            lines.append(f"host = [ptrs({host_layer} for layer in {layers}) for c in range({len(pool.components)})]")
            args = (["src_layers=dev[0]", "dst_layers=host[0]"] if mla else
                    ["src_k_layers=dev[0]", "dst_k_layers=host[0]", "src_v_layers=dev[1]", "dst_v_layers=host[1]"])
        else:
            host_t = f'typed(raw, "{name}", "host")'
            args = (["src_layers=dev[0]", f"dst={host_t}"] if mla else
                    ["src_k_layers=dev[0]", f"dst_k={host_t}[0]", "src_v_layers=dev[1]", f"dst_v={host_t}[1]"])
            args.append(f"dst_layout_dim={item * case.layers}")
        args += ["src_indices=dev_idx", "dst_indices=host_idx", f"item_size={item}", f"num_layers={case.layers}"]
    if layout is HostLayout.PAGE_HEAD:
        args += [f"page_size={case.page_size}", f"head_num={pool.heads}"]
    lines.append(f"kvcacheio.{op}(")
    lines += [f"    {a}," for a in args]
    lines.append(")")
    return "\n".join(lines)


CallTemplate = Callable[[Case, Platform], str]

CALLS: dict[str, CallTemplate] = {
    "sglang-jit": lambda case, platform: _jit(case, platform, None),
    "sglang-jit-register": lambda case, platform: _jit(case, platform, "off"),
    "sglang-jit-tma": lambda case, platform: _jit(case, platform, "on"),
    "sglang-staged": _staged,
    "sglang-page-unified": _page_unified,
    "sglang-aot": _aot,
    "sglang-pool": pool_call,
}
