"""Backends: the interface (base), lookup and plugins (registry), the CPU reference, the bug zoo,
and the real sglang kernels."""
