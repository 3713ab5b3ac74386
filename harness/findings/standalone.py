"""Standalone reproducers: a failing sglang case as one Python script that needs only torch and sglang.

The script builds the case's storages byte for byte as the harness does (guard | payload | guard, filled with
the address-tagged splitmix64 pattern of :func:`hicache_fuzz.harness.pipeline.materialize.fill_pattern`, with the salts
computed here and written in as numbers), calls the sglang entry point the case's backend calls, with the same
arguments (a kernel backend's own call description printed: :mod:`hicache_fuzz.harness.findings.standalone_calls`),
computes the expected bytes with a few lines of torch indexing, compares uint8 views of every whole storage and
prints the first differing K/V, layer, page, token and byte. What the script expects is the contract's verdict for the
case (:func:`hicache_fuzz.oracles.contract.predict`): accept (then the bytes must match) or reject (then the
call must raise). It exits 0 when sglang behaves as the contract says, 1 while the bug is present; it also runs
under pytest (one ``test_*`` function).

``<case_id>.standalone.py`` is written next to every reproducer of an sglang backend, and
:func:`write_corpus_scripts` writes them for a committed corpus (``corpus/sglang``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hicache_fuzz.harness.findings.standalone_calls import CALLS
from hicache_fuzz.harness.findings.standalone_hicache import BACKEND as HICACHE_BACKEND
from hicache_fuzz.harness.findings.standalone_hicache import hicache_script, unscripted_reason
from hicache_fuzz.harness.model.case import Attention, Case, Direction, HostAllocator, HostLayout, IndexDevice, PoolSpec
from hicache_fuzz.harness.model.json_input import read_json_file
from hicache_fuzz.harness.model.output_paths import write_text_atomic
from hicache_fuzz.harness.pipeline.fill import salt as _salt
from hicache_fuzz.kernels.buffers import GUARD_BYTES, TORCH_DTYPES
from hicache_fuzz.oracles import layouts
from hicache_fuzz.oracles.contract import Platform, Verdict, predict
from hicache_fuzz.oracles.transfer import token_pairs_numpy

SUFFIX = ".standalone.py"
# The platform the recorded findings come from (CUDA sm90); the contract's verdict can depend on the platform.
DEFAULT_PLATFORM = Platform("cuda", (9, 0))


class StandaloneUnsupported(ValueError):
    """The case has no standalone form (not an sglang backend, or a case sglang's calls cannot express)."""


def supports(backend: str) -> bool:
    return backend in CALLS or backend == HICACHE_BACKEND


def standalone_path(json_path: Path) -> Path:
    return json_path.with_name(json_path.stem + SUFFIX)


def write_standalone(json_path: Path, platform: Platform = DEFAULT_PLATFORM) -> Path:
    """Write ``<stem>.standalone.py`` next to the reproducer ``json_path``; returns its path."""
    data = read_json_file(json_path)
    path = standalone_path(json_path)
    write_text_atomic(path, standalone_script(data, platform))  # onto a regular file or a new path only
    path.chmod(0o755)
    return path


def corpus_reproducers(directory: Path) -> list[Path]:
    """Reproducer JSON files under `directory` whose backend has a standalone form."""
    out = []
    for path in sorted(directory.rglob("*.json")):
        data = read_json_file(path)
        case = data.get("case", data) if isinstance(data, dict) else None
        if isinstance(case, dict) and supports(str(case.get("backend", ""))):
            out.append(path)
    return out


def write_corpus_scripts(directory: Path, platform: Platform = DEFAULT_PLATFORM) -> list[Path]:
    """(Re)write the standalone script of every sglang reproducer under `directory`."""
    return [write_standalone(path, platform) for path in corpus_reproducers(directory)]


def stale_corpus_scripts(directory: Path, platform: Platform = DEFAULT_PLATFORM) -> list[Path]:
    """Scripts under `directory` that are missing or differ from what the generator writes now."""
    stale = []
    for path in corpus_reproducers(directory):
        script = standalone_path(path)
        expected = standalone_script(read_json_file(path), platform)
        if not script.exists() or script.read_text() != expected:
            stale.append(script)
    return stale


def main(argv: list[str] | None = None) -> int:
    """``python -m hicache_fuzz.harness.findings.standalone DIR...``: (re)write the standalone scripts of the sglang
    reproducers under each DIR (e.g. corpus/sglang); ``--check`` only lists stale ones (exit 1 if any)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hicache_fuzz.harness.findings.standalone")
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="list missing or stale scripts; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        stale = [p for d in args.directories for p in stale_corpus_scripts(d)]
        for path in stale:
            print(f"stale: {path}")
        return 1 if stale else 0
    for directory in args.directories:
        for path in write_corpus_scripts(directory):
            print(f"wrote {path}")
    return 0


# ---- the script -------------------------------------------------------------------------------------------

_TYPE_NAMES = {"bfloat16": "torch.bfloat16", "float16": "torch.float16", "float32": "torch.float32",
               "uint8": "torch.uint8"}


def _host_axes(case: Case, pool: PoolSpec) -> tuple[str, ...]:
    if pool.attention is Attention.MLA:
        return {HostLayout.LAYER_FIRST: ("layer", "token", "head", "byte"),
                HostLayout.PAGE_FIRST: ("token", "layer", "head", "byte"),
                HostLayout.PAGE_FIRST_DIRECT: ("page", "layer", "slot", "head", "byte"),
                HostLayout.PAGE_UNIFIED: ("page", "layer", "slot", "byte")}[case.layout]
    return {HostLayout.LAYER_FIRST: ("k/v", "layer", "token", "head", "byte"),
            HostLayout.PAGE_FIRST: ("k/v", "token", "layer", "head", "byte"),
            HostLayout.PAGE_FIRST_DIRECT: ("k/v", "page", "layer", "slot", "head", "byte"),
            HostLayout.PAGE_HEAD: ("k/v", "page", "head", "slot", "layer", "byte"),
            HostLayout.PAGE_UNIFIED: ("page", "group", "layer", "k/v", "slot", "head", "byte")}[case.layout]


def _host_row_index(case: Case, pool: PoolSpec) -> str:
    """The index expression selecting host rows (tokens t, layer l, component c) of the host byte view."""
    mla = pool.attention is Attention.MLA
    c = "" if mla else "c, "
    return {HostLayout.LAYER_FIRST: f"{c}l, t",
            HostLayout.PAGE_FIRST: f"{c}t, l",
            HostLayout.PAGE_FIRST_DIRECT: f"{c}t // PS, l, t % PS",
            HostLayout.PAGE_HEAD: "c, t // PS, :, t % PS, l",
            HostLayout.PAGE_UNIFIED: "t // PS, l, t % PS" if mla else "t // PS, :, l, c, t % PS"}[case.layout]


def _allocator_helper(case: Case) -> str:
    allocator = case.host_allocator
    if allocator is HostAllocator.PAGEABLE:
        return '''def host_memory(nbytes):  # pageable host memory
    return torch.empty(nbytes, dtype=torch.uint8)'''
    if allocator is HostAllocator.PIN_MEMORY:
        return '''def host_memory(nbytes):  # pinned host memory (cudaHostAlloc)
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=DEVICE.type == "cuda")'''
    return '''def host_memory(nbytes):  # mmap + cudaHostRegister, as sglang allocates host pools in production
    region = mmap.mmap(-1, nbytes)
    tensor = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)
    KEEP.append(region)
    if DEVICE.type == "cuda":
        status = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, 0)
        assert int(status) == 0, f"cudaHostRegister failed: {int(status)}"
    return tensor'''


def _index_expr(values: tuple[int, ...], dtype: str, placement: IndexDevice) -> str:
    tensor = f"torch.tensor({list(values)}, dtype=torch.int64)"
    if dtype != "int64":  # int32 lists: what a caller casting them passes (values are taken as given)
        tensor += f".to(torch.{dtype})"
    if placement is IndexDevice.DEVICE:
        return f"{tensor}.to(DEVICE)"
    if placement is IndexDevice.PINNED:
        return f'({tensor}.pin_memory() if DEVICE.type == "cuda" else {tensor})'
    return tensor


def _indent(text: str, spaces: int = 4) -> str:
    return "\n".join((" " * spaces + line) if line else "" for line in text.splitlines())


def _expected_body(case: Case) -> str:
    write = case.direction is Direction.WRITE_BACK
    lines = []
    for pool in case.pools:
        name, mla = pool.name, pool.attention is Attention.MLA
        host_side, dev_side = ("after", "before") if write else ("before", "after")
        lines += [f'dev, host = as_bytes({dev_side}, "{name}", "device"), as_bytes({host_side}, "{name}", "host")',
                  "for l in MOVED_LAYERS:"]
        lines.append("    for c in (0,):" if mla else "    for c in (0, 1):  # K, V")
        host_index = _host_row_index(case, pool)
        if write:
            lines.append(f"        host[{host_index}] = dev[c, l, r].reshape(host[{host_index}].shape)")
        else:
            lines.append(f"        dev[c, l, r] = host[{host_index}].reshape(dev[c, l, r].shape)")
    return "\n".join(lines)


def _docstring_safe(text: str) -> str:
    return text.replace('"""', "'''").replace("\\", "/")


def _pool_tables(case: Case) -> tuple[list[str], list[str], list[str]]:
    """The script's POOLS (dtype and shapes), SALTS (the fill's per-storage salts) and AXES rows, per pool."""
    src_side = "device" if case.direction is Direction.WRITE_BACK else "host"
    pools, salts, axes = [], [], []
    for number, pool in enumerate(case.pools):
        dtype = _TYPE_NAMES[str(TORCH_DTYPES[pool.dtype]).removeprefix("torch.")]
        device_shape = (len(pool.components), case.layers, case.device_rows, pool.heads, pool.head_dim)
        host_shape = layouts.host_shape(case, pool)
        pools.append(f'    "{pool.name}": ({dtype}, {device_shape}, {tuple(host_shape)}),')
        for side in ("device", "host"):
            role = "source" if side == src_side else "destination"
            salts.append(f'    "{pool.name}/{side}": {_salt(case.seed, number, pool.name, side, role)},')
        kv = "kv" if pool.attention is Attention.MLA else "k/v"
        axes.append(f'    "{pool.name}/device": {(kv, "layer", "row", "head", "byte")},')
        axes.append(f'    "{pool.name}/host": {_host_axes(case, pool)},')
    return pools, salts, axes


def standalone_script(reproducer: dict[str, Any], platform: Platform = DEFAULT_PLATFORM,
                      broken_call: bool = False) -> str:
    """The text of the standalone script for a reproducer (or bare case) dict. `broken_call` drops the last
    page from both index lists before the call, on purpose: a defect of the caller's kind, for proving on a
    machine with the real sglang that the script catches one where no sglang bug is known."""
    case = Case.from_dict(reproducer.get("case", reproducer))
    if case.backend == HICACHE_BACKEND:  # a sequence through sglang's controller: a script of its own
        why = unscripted_reason(case)
        if why is not None:
            raise StandaloneUnsupported(why)
        return hicache_script(case, reproducer)
    template = CALLS.get(case.backend)
    if template is None:
        raise StandaloneUnsupported(f"backend {case.backend!r} has no standalone form (sglang backends only)")
    if any(p.attention is Attention.MHA_ASYM for p in case.pools):
        raise StandaloneUnsupported("asymmetric K/V pools: no sglang entry point takes them")
    from hicache_fuzz.kernels.registry import load_registry

    plan = load_registry().get(case.backend).plan(case, platform)
    prediction = predict(case, plan.entry, platform)
    if prediction.verdict is Verdict.UNDEFINED:
        raise StandaloneUnsupported(f"the contract leaves this case undefined: {prediction.describe()}")
    host_tokens, device_rows = token_pairs_numpy(case, prediction.semantics)
    observed = reproducer.get("observed", {})
    summary = str(observed.get("summary") or observed.get("error") or "").splitlines()
    signature = str(reproducer.get("signature", ""))
    pools, salts, axes = _pool_tables(case)

    if prediction.verdict is Verdict.REJECT:
        verdict = "reject the call: " + "; ".join(prediction.reasons)
    else:
        verdict = "accept the call and move exactly the rows listed in HOST_TOKENS / DEVICE_ROWS"
    semantics_note = {"per_token": "per token: host index i <-> device index i",
                      "page_runs": "whole pages: host rows h[j*PS] + t <-> device rows d[j*PS] + t",
                      "page_aligned_host": "whole pages: host page h[j*PS] // PS",
                      "page_aligned": "whole pages: page ids on both sides"}[prediction.semantics.value]
    imports = ["import mmap"] if case.host_allocator is HostAllocator.HOST_REGISTER else []
    call = template(case, platform)
    if broken_call:
        call = ("# BROKEN CALL, on purpose: the last page is not passed, so its rows must come out wrong\n"
                "host_idx, dev_idx = host_idx[:-PS], dev_idx[:-PS]\n" + call)
    imports += ["import os"] if "os.environ" in call else []
    imports += ["import sys", "", "import torch"]
    fields = {
        "case_id": case.case_id,
        "backend": case.backend,
        "signature": signature or "(none recorded)",
        "observed": _docstring_safe(f"{observed.get('outcome', '?')}: {summary[0]}" if summary else "(not recorded)"),
        "note": _docstring_safe(case.note),
        "verdict": verdict,
        "imports": "\n".join(imports),
        "pools": "\n".join(pools),
        "salts": "\n".join(salts),
        "axes": "\n".join(axes),
        "allocator": _allocator_helper(case),
        "page_size": case.page_size,
        "host_idx": _index_expr(case.host_indices, case.host_index.dtype.value, case.host_index.device),
        "dev_idx": _index_expr(case.device_indices, case.device_index.dtype.value, case.device_index.device),
        "call": _indent(call),
        "accept": prediction.verdict is Verdict.ACCEPT,
        "reject_reason": "; ".join(prediction.reasons),
        "host_tokens": host_tokens.tolist(),
        "device_rows": device_rows.tolist(),
        "moved_layers": list(case.moved_layers),
        "semantics": semantics_note,
        "expected": _indent(_expected_body(case)),
        "guard": GUARD_BYTES,
        "test_name": "test_" + case.case_id,
    }
    return _SCRIPT.format(**fields)


_SCRIPT = '''#!/usr/bin/env python3
"""Standalone reproducer {case_id}: sglang backend {backend} ({signature}).

Observed: {observed}
{note}
The contract says sglang must {verdict}.
Needs only torch and sglang. Run `python this_file.py` or `pytest this_file.py`;
exit 0: sglang behaves as it must; 1: the bug is present (the first differing byte is printed);
3: sglang or this op cannot run here.
Generated by hicache-fuzz (harness/findings/standalone.py) from {case_id}.json next to this file.
"""

{imports}

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: only for the CI's fake sglang
GUARD = {guard}  # guard bytes before and after every payload: a write outside the payload shows there
PS = {page_size}  # page size
KEEP = []  # host memory that must outlive its tensors
# pool: (dtype, device shape (K/V, layer, row, head, dim), host shape in sglang's layout)
POOLS = {{
{pools}
}}
# fill salt of every storage: source and destination differ, so an unwritten byte never looks moved
SALTS = {{
{salts}
}}
AXES = {{  # names of the byte-view axes, for the report of the first differing byte
{axes}
}}
ACCEPT = {accept}  # the contract's verdict: True = must accept and move; False = must reject
REJECT_REASON = "{reject_reason}"
# the rows a correct transfer moves ({semantics})
HOST_TOKENS = {host_tokens}
DEVICE_ROWS = {device_rows}
MOVED_LAYERS = {moved_layers}


def pattern(nbytes, salt):
    """Address-tagged fill: 8-byte word w holds splitmix64(w ^ salt) (wrapping int64, little-endian)."""
    x = torch.arange((nbytes + 7) // 8, dtype=torch.int64) ^ salt
    x = x * -7046029254386353131  # 0x9E3779B97F4A7C15
    x = x ^ (x >> 31)
    x = x * -4658895280553007687  # 0xBF58476D1CE4E5B9
    x = x ^ (x >> 29)
    return x.view(torch.uint8)[:nbytes]


{allocator}


def shape_of(key):
    dtype, device_shape, host_shape = POOLS[key.split("/")[0]]
    return dtype, device_shape if key.endswith("/device") else host_shape


def payload(raw, pool, side):
    return raw[f"{{pool}}/{{side}}"][GUARD:-GUARD]


def typed(raw, pool, side):  # the payload in sglang's dtype and shape
    dtype, shape = shape_of(f"{{pool}}/{{side}}")
    return payload(raw, pool, side).view(dtype).view(shape)


def as_bytes(raw, pool, side):  # the payload in sglang's shape, last axis in bytes
    dtype, shape = shape_of(f"{{pool}}/{{side}}")
    return payload(raw, pool, side).view(*shape[:-1], shape[-1] * dtype.itemsize)


def ptrs(tensors):  # a uint64 device table of base addresses
    return torch.tensor([address(t) for t in tensors], dtype=torch.uint64, device=DEVICE)


def address(t):  # host memory: CUDA maps it at the same address; ROCm may need its device alias
    if t.device.type == "cpu" and torch.version.hip:
        from sgl_kernel.kvcacheio import get_device_accessible_ptr

        return int(get_device_accessible_ptr(t))
    return t.data_ptr()


def make_storages():
    raw = {{}}
    for key, salt in SALTS.items():
        dtype, shape = shape_of(key)
        nbytes = 2 * GUARD + dtype.itemsize * torch.Size(shape).numel()
        raw[key] = pattern(nbytes, salt).to(DEVICE) if key.endswith("/device") else host_memory(nbytes).copy_(
            pattern(nbytes, salt))
    return raw


def call_sglang(raw, host_idx, dev_idx):
{call}


def expected_after(before):
    """A correct transfer: destination rows take the source rows; every other byte (guards too) is unchanged."""
    after = {{key: value.clone() for key, value in before.items()}}
    t, r = torch.tensor(HOST_TOKENS, dtype=torch.int64), torch.tensor(DEVICE_ROWS, dtype=torch.int64)
{expected}
    return after


def first_difference(key, got, want):
    differ = (got != want).nonzero().flatten()
    if differ.numel() == 0:
        return None
    at = int(differ[0])
    dtype, shape = shape_of(key)
    shape = (*shape[:-1], shape[-1] * dtype.itemsize)
    if at < GUARD or at >= got.numel() - GUARD:
        where = "a guard byte outside the payload"
    else:
        offset, coords = at - GUARD, []
        for axis, size in reversed(list(zip(AXES[key], shape))):
            offset, index = divmod(offset, size)
            coords.insert(0, (axis, index))
        named = dict(coords)
        if "slot" in named:
            coords.append(("token", named["page"] * PS + named["slot"]))
        if "row" in named:
            coords.append(("page", named["row"] // PS))
        where = " ".join(f"{{axis}}={{index}}" for axis, index in coords)
    return (f"{{key}}: {{differ.numel()}} bytes differ; first at storage byte {{at}} ({{where}}): "
            f"got 0x{{int(got[at]):02x}}, expected 0x{{int(want[at]):02x}}")


def main():
    raw = make_storages()
    host_idx = {host_idx}
    dev_idx = {dev_idx}
    before = {{key: value.cpu().clone() for key, value in raw.items()}}
    try:
        call_sglang(raw, host_idx, dev_idx)
        rejection = None
    except (ImportError, NotImplementedError) as exc:  # no sglang here, or only a stand-in without this op
        missing = (f"{{exc.name}} is not importable ({{exc}})" if isinstance(exc, ImportError) and exc.name
                   else f"{{type(exc).__name__}}: {{exc}}")
        print(f"SKIP: cannot run here: {{missing}} (torch {{torch.__version__}})")
        return 3
    except Exception as exc:
        rejection = f"{{type(exc).__name__}}: {{str(exc).splitlines()[0] if str(exc) else ''}}"
    if DEVICE.type == "cuda":
        try:  # an error the call left pending (a bad launch) surfaces at the next launch check
            torch.cuda.synchronize()
            torch.zeros(1, device=DEVICE).add_(1)
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"FAIL: a device error escaped the call: {{type(exc).__name__}}: {{str(exc).splitlines()[0]}}")
            return 1
    if rejection is not None:
        print(f"{{'FAIL: sglang rejected an input it must accept' if ACCEPT else 'PASS: rejected as it must'}}: "
              f"{{rejection}}" + ("" if ACCEPT else f" (the contract: {{REJECT_REASON}})"))
        return 1 if ACCEPT else 0
    if not ACCEPT:
        print(f"FAIL: sglang accepted an input it must reject: {{REJECT_REASON}}")
        return 1
    want = expected_after(before)
    diffs = [d for key in raw if (d := first_difference(key, raw[key].cpu(), want[key]))]
    for line in diffs:
        print("FAIL:", line)
    if not diffs:
        print(f"PASS: every byte of {{len(raw)}} storages as expected")
    return 1 if diffs else 0


def {test_name}():
    code = main()
    if code == 3:
        import pytest

        pytest.skip("sglang (or this op) is not available here")
    assert code == 0


if __name__ == "__main__":
    sys.exit(main())
'''


if __name__ == "__main__":
    raise SystemExit(main())
