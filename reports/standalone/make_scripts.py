"""Write reports/standalone/scripts/: one standalone script per synthetic valid case of every sglang backend
kind (tests/campaign/test_standalone.py SYNTHETIC), as generated (must pass on a correct sglang) and with a broken call
(``*.broken.py``: must fail, naming the first differing byte). Run from the repository root:

    python reports/standalone/make_scripts.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from hicache_fuzz.harness.campaign.standalone import standalone_script

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.test_standalone
from tests.campaign.test_standalone import SYNTHETIC

OUT = Path(__file__).resolve().parent / "scripts"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, body in SYNTHETIC.items():
        (OUT / f"{name}.py").write_text(standalone_script(body))
        (OUT / f"{name}.broken.py").write_text(standalone_script(body, broken_call=True))
        print(f"wrote {OUT / name}.py and .broken.py")


if __name__ == "__main__":
    main()
