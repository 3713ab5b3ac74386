"""Build sglang's AOT kvcacheio transfer ops (``torch.ops.sgl_kernel.transfer_kv_*``) for the installed torch.

``fetch_sources`` downloads the pinned public sglang sources (never copied into this repository),
``build`` compiles them with this project's own op registration (``csrc/register.cc``) through torch's
extension builder (nvcc, or hipcc after torch's hipify on ROCm), and ``loader.activate()`` makes
``sgl_kernel.kvcacheio`` callable in the process: the real sglang-kernel if it loads, else this build behind
the stand-in package in ``sgl_kernel_standin/``. See docs/aot.md.
"""
