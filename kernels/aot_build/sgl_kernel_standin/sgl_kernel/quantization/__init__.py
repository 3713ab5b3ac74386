"""Import-only: sglang imports names from here at module load; they are placeholders."""

from sgl_kernel._placeholder import placeholder_getattr

__getattr__ = placeholder_getattr(__name__)
