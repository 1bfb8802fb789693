"""Every test module is collected: a pytest plugin an optional extra brings (ai-dynamo ships
several) must not skip a file of this suite silently."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_module_is_collected() -> None:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", str(TESTS)],
                         cwd=TESTS.parent, capture_output=True, text=True, check=False,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # with the suite's own -q (pyproject addopts) the listing is "tests/test_x.py: N"
    collected = {Path(m).name for m, n in re.findall(r"^(tests/test_\w+\.py): (\d+)$",
                                                      res.stdout, re.M) if int(n)}
    modules = {p.name for p in TESTS.glob("test_*.py")}
    assert modules - collected == set(), f"modules with no test collected: {modules - collected}"
