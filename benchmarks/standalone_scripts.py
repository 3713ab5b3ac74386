"""Write the per-kind standalone scripts of the GPU standalone check into a folder.

    python benchmarks/standalone_scripts.py OUT_DIR

One script per synthetic valid case of every sglang backend kind (``SYNTHETIC`` of
tests/campaign/test_standalone.py, where the CPU test runs them against the fake sglang), as generated (must
pass on a correct sglang, exit 0) and with a broken call (``<name>.broken.py``: the last page is not passed; must
fail naming the first differing byte, exit 1). reports/standalone/README.md runs them, with the findings'
scripts in corpus/sglang, against the real sglang on a GPU. Run from the repository root (it imports the test
module for the cases).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hicache_fuzz.harness.findings.standalone import standalone_script


def write_scripts(out: Path) -> list[Path]:
    from tests.campaign.test_standalone import SYNTHETIC

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in SYNTHETIC.items():
        for path, broken in ((out / f"{name}.py", False), (out / f"{name}.broken.py", True)):
            path.write_text(standalone_script(body, broken_call=broken))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python benchmarks/standalone_scripts.py OUT_DIR", file=sys.stderr)
        return 2
    for path in write_scripts(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `tests` importable
    sys.exit(main())
