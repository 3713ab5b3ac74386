"""tox's inline plugin (tox 4 loads ``toxfile.py`` next to tox.ini): every env sees the torch of the interpreter
tox runs from.

The envs are virtualenvs with ``system_site_packages``: they see the site-packages of the *base* interpreter,
not those of a virtualenv that tox itself runs in. After the README's quick start, torch lives in exactly such a
virtualenv. So when ``HICACHE_FUZZ_TORCH_SITE`` is unset and the interpreter running tox can import torch, it is
set to the folder holding that torch; each env's pre-check (harness/commands/envcheck.py) then links that folder
into the env with a ``.pth`` file. An explicit ``HICACHE_FUZZ_TORCH_SITE`` is kept as it is.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from tox.plugin import impl

TORCH_SITE_ENV = "HICACHE_FUZZ_TORCH_SITE"


def calling_torch_site() -> str | None:
    """The site-packages folder that holds the torch this interpreter imports (found without importing it)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    return str(Path(spec.origin).resolve().parent.parent)


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    if not os.environ.get(TORCH_SITE_ENV):
        site = calling_torch_site()
        if site:
            os.environ[TORCH_SITE_ENV] = site
