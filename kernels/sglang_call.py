"""One definition of each sglang kernel call: what a backend hands sglang, as data that both runs and prints.

A kernel backend (sglang-jit and its TMA/register variants, sglang-staged, sglang-page-unified, sglang-aot)
describes each call it makes as a :class:`SglangCall`: the function's name and its arguments, each either a
plain value or a reference to one of the case's tensors as sglang takes it (a typed device layer, a host view,
a table of per-layer base addresses, an index list, a staging buffer, page ids). The backend runs the calls on
its :class:`~hicache_fuzz.kernels.buffers.Materialized` storages (:meth:`SglangCall.run`); a standalone
reproducer prints the same calls as Python (:meth:`SglangCall.source`), in terms of the script's helpers
(``typed(raw, pool, side)``, ``ptrs(tensors)``, ``host_idx``, ``dev_idx``, ``DEVICE``; see
harness/findings/standalone.py). So the script calls sglang exactly as the campaign did, by construction.

A host tensor that sglang's own host pool allocated (:class:`HostPoolBuffer`, the page_unified pools'
``kv_buffer``) is no storage of the case: the backend that built the pools hands them to :meth:`SglangCall.run`
by pool name, and the script builds the same pools into its ``host_pools``.

A tensor reference names its pool and K/V component; the script's ``typed(raw, pool, "device")`` is
``(component, layer, rows, heads, dim)`` and ``typed(raw, pool, "host")`` the host tensor in sglang's shape
(MHA: a leading K/V axis; MLA: none), which is what the buffers' typed views are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from hicache_fuzz.harness.model.case import Attention, HostLayout, PoolSpec
from hicache_fuzz.kernels import sglang_common as common
from hicache_fuzz.kernels.buffers import Materialized, PoolBuffers

NO_HOST_POOLS: Mapping[str, Any] = MappingProxyType({})


def _pool(buffers: Materialized, name: str) -> PoolBuffers:
    return next(pool for pool in buffers.pools if pool.spec.name == name)


@dataclass(frozen=True)
class DeviceLayer:
    """One device layer of one component, typed (rows, heads, dim) as sglang's device pools hold it."""

    pool: str
    component: str  # "k", "v" or "kv" (MLA)
    index: int  # the component's position: the script's first device axis
    layer: int

    def value(self, buffers: Materialized) -> Any:
        return _pool(buffers, self.pool).device_layer_typed(self.component, self.layer)

    def base(self, buffers: Materialized) -> Any:
        """The layer as a uint8 view: the same base address, cheaper to make (a table takes only addresses)."""
        return _pool(buffers, self.pool).device_layer(self.component, self.layer)

    def source(self) -> str:
        return f'typed(raw, "{self.pool}", "device")[{self.index}, {self.layer}]'


@dataclass(frozen=True)
class HostTensor:
    """The host tensor in sglang's shape: the whole of an MLA pool, one K/V half of an MHA pool."""

    pool: str
    component: str
    index: int | None  # the K/V axis position; None for a host tensor without one (MLA)

    def value(self, buffers: Materialized) -> Any:
        pool = _pool(buffers, self.pool)
        return pool.host_typed() if self.index is None else pool.host_component_typed(self.component)

    def source(self) -> str:
        whole = f'typed(raw, "{self.pool}", "host")'
        return whole if self.index is None else f"{whole}[{self.index}]"


@dataclass(frozen=True)
class HostPoolBuffer:
    """The host tensor sglang's own host pool of one pool allocated (its ``kv_buffer``), in sglang's shape and dtype:
    the backend copies the case's host bytes into it before the calls and back after them."""

    pool: str

    def value(self, buffers: Materialized, host_pools: Mapping[str, Any]) -> Any:
        if self.pool not in host_pools:
            raise RuntimeError(f"harness: no sglang host pool was built for pool {self.pool!r}")
        return host_pools[self.pool].kv_buffer

    def source(self) -> str:
        return f'host_pools["{self.pool}"].kv_buffer'


@dataclass(frozen=True)
class HostLayer:
    """One layer of a host tensor as sglang's host pools pass it: (tokens, heads, dim), strided for page_first."""

    tensor: HostTensor
    layer: int
    layer_first: bool

    def value(self, buffers: Materialized) -> Any:
        whole = self.tensor.value(buffers)
        return whole[self.layer] if self.layer_first else whole[:, self.layer]

    def source(self) -> str:
        whole = self.tensor.source()
        return f"{whole}[{self.layer}]" if self.layer_first else f"{whole}[:, {self.layer}]"


@dataclass(frozen=True)
class LayerTable:
    """A uint64 device table of the base addresses of every layer (device layers, or host layers)."""

    layers: tuple[DeviceLayer, ...] | tuple[HostLayer, ...]

    def value(self, buffers: Materialized) -> Any:
        views = [layer.base(buffers) if isinstance(layer, DeviceLayer) else layer.value(buffers)
                 for layer in self.layers]
        return common.ptr_table(views, buffers.device)

    def source(self) -> str:
        first = self.layers[0]
        # The same view for every layer, as a generator over the layer number.
        if isinstance(first, DeviceLayer):
            view = f'typed(raw, "{first.pool}", "device")[{first.index}, layer]'
        else:
            whole = first.tensor.source()
            view = f"{whole}[layer]" if first.layer_first else f"{whole}[:, layer]"
        return f"ptrs({view} for layer in range({len(self.layers)}))"


@dataclass(frozen=True)
class Indices:
    """The case's index tensor of one side, as the harness placed it (device, dtype)."""

    side: str  # "host" or "device"

    def value(self, buffers: Materialized) -> Any:
        return buffers.host_indices if self.side == "host" else buffers.device_indices

    def source(self) -> str:
        return "host_idx" if self.side == "host" else "dev_idx"


@dataclass(frozen=True)
class PageIds:
    """Page ids as a caller derives them from an index list: the first index of each page // page size."""

    indices: Indices
    page_size: int

    def value(self, buffers: Materialized) -> Any:
        ps = self.page_size
        return torch.div(self.indices.value(buffers)[::ps], ps, rounding_mode="floor").contiguous()

    def source(self) -> str:
        ps = self.page_size
        return f'torch.div({self.indices.source()}[::{ps}], {ps}, rounding_mode="floor").contiguous()'


@dataclass(frozen=True)
class Staging:
    """An uninitialised device buffer of `rows` leading rows, shaped and typed like the rest of `like`."""

    like: HostTensor | HostPoolBuffer
    rows: int

    def value(self, buffers: Materialized, host_pools: Mapping[str, Any] = NO_HOST_POOLS) -> Any:
        like = _value(self.like, buffers, host_pools)
        return torch.empty((self.rows, *like.shape[1:]), dtype=like.dtype, device=buffers.device)

    def source(self) -> str:
        like = self.like.source()
        return f"torch.empty(({self.rows}, *{like}.shape[1:]), dtype={like}.dtype, device=DEVICE)"


Argument = DeviceLayer | HostTensor | HostPoolBuffer | HostLayer | LayerTable | Indices | PageIds | Staging | int | None


def _value(argument: Argument, buffers: Materialized, host_pools: Mapping[str, Any]) -> Any:
    if argument is None or isinstance(argument, int):
        return argument
    if isinstance(argument, HostPoolBuffer | Staging):
        return argument.value(buffers, host_pools)
    return argument.value(buffers)


def _source(argument: Argument) -> str:
    return repr(argument) if argument is None or isinstance(argument, int) else argument.source()


@dataclass(frozen=True)
class SglangCall:
    """``module.function(*args, **kwargs)`` with the case's tensors: run by the backend, printed by the script."""

    module: str  # the name the script imports the module as: "hicache" or "kvcacheio"
    function: str
    args: tuple[Argument, ...] = ()
    kwargs: tuple[tuple[str, Argument], ...] = ()

    def run(self, module: Any, buffers: Materialized, host_pools: Mapping[str, Any] = NO_HOST_POOLS) -> None:
        """The call on the case's storages; `host_pools` are sglang's host pools by pool name, for the arguments
        that are their tensors (:class:`HostPoolBuffer`)."""
        function = getattr(module, self.function)
        function(*(_value(a, buffers, host_pools) for a in self.args),
                 **{k: _value(a, buffers, host_pools) for k, a in self.kwargs})

    def source(self) -> str:
        """The call as script lines, one argument a line."""
        lines = [f"{self.module}.{self.function}("]
        lines += [f"    {_source(a)}," for a in self.args]
        lines += [f"    {key}={_source(a)}," for key, a in self.kwargs]
        return "\n".join([*lines, ")"])


# ---- the references a backend builds its calls from ----------------------------------------------------------

def device_layer(spec: PoolSpec, component: str, layer: int) -> DeviceLayer:
    return DeviceLayer(spec.name, component, spec.components.index(component), layer)


def host_tensor(spec: PoolSpec, component: str) -> HostTensor:
    return HostTensor(spec.name, component, None if spec.attention is Attention.MLA else
                      spec.components.index(component))


def whole_host(spec: PoolSpec) -> HostTensor:
    """The pool's whole host tensor (page_unified interleaves K and V inside each page: no K/V axis to take)."""
    return HostTensor(spec.name, "", None)


def host_pool_buffer(spec: PoolSpec) -> HostPoolBuffer:
    """The host tensor sglang's host pool of `spec` allocated."""
    return HostPoolBuffer(spec.name)


def host_layer(spec: PoolSpec, component: str, layer: int, layout: HostLayout) -> HostLayer:
    return HostLayer(host_tensor(spec, component), layer, layout is HostLayout.LAYER_FIRST)


def device_table(spec: PoolSpec, component: str, layers: int) -> LayerTable:
    return LayerTable(tuple(device_layer(spec, component, layer) for layer in range(layers)))


def host_table(spec: PoolSpec, component: str, layers: int, layout: HostLayout) -> LayerTable:
    return LayerTable(tuple(host_layer(spec, component, layer, layout) for layer in range(layers)))


HOST_INDICES = Indices("host")
DEVICE_INDICES = Indices("device")
