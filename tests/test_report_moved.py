"""docs/report.py --moved: every published cell that moved between two renderings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parent.parent / "docs" / "report.py"

OLD = """# Doc

### CPU-tier sweep (qwen3-8b, N=8, fcfs, GPU 128K)

| CPU/GPU | sglang TTFT s | TTFT change | paper |
|---|---|---|---|
| 1x | 17.83 | -36.3% | -10.0% |
| 4x | 4.30 | +6.2% | +0.0% |
| 8x | 4.00 | +1.0% | - |

### Not a results table

| a | b |
|---|---|
| 1 | 2 |
"""

NEW = """### CPU-tier sweep (qwen3-8b, N=8, fcfs, GPU 128K)

| CPU/GPU | sglang TTFT s | TTFT change | paper |
|---|---|---|---|
| 1x | 17.83 | -35.0% | -11.0% |
| 4x | 4.31 | +6.2% | +0.0% |
| 2x | 9.00 | -50.0% | - |

### Not a results table

| a | b |
|---|---|
| 1 | 3 |
"""


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *args], capture_output=True, text=True)


def test_moved_lists_each_changed_cell_new_and_gone_rows(tmp_path) -> None:
    (tmp_path / "old.md").write_text(OLD)
    (tmp_path / "new.md").write_text(NEW)
    res = run_report("--moved", str(tmp_path / "old.md"), str(tmp_path / "new.md"))
    assert res.returncode == 0, res.stderr
    rows = res.stdout.splitlines()[2:]
    assert rows == [
        "| CPU-tier sweep | 1x | TTFT change | -36.3% | -35.0% |",  # paper column left out
        "| CPU-tier sweep | 4x | sglang TTFT s | 4.30 | 4.31 |",
        "| CPU-tier sweep | 2x | (new row) | - | - |",
        "| CPU-tier sweep | 8x | (row gone) | - | - |",
    ]


def test_moved_on_identical_tables_says_so_and_bad_arguments_exit_2(tmp_path) -> None:
    (tmp_path / "old.md").write_text(OLD)
    res = run_report("--moved", str(tmp_path / "old.md"), str(tmp_path / "old.md"))
    assert res.stdout.strip() == "No published cell moved."
    for args in (["--moved", str(tmp_path / "old.md")],
                 ["--moved", str(tmp_path / "old.md"), str(tmp_path / "none.md")]):
        res = run_report(*args)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr.startswith("report.py: error: ") and len(res.stderr.splitlines()) == 1


def test_moved_headlines_keeps_only_the_change_columns(tmp_path) -> None:
    (tmp_path / "old.md").write_text(OLD)
    (tmp_path / "new.md").write_text(NEW)
    res = run_report("--moved", "--headlines", str(tmp_path / "old.md"), str(tmp_path / "new.md"))
    assert res.stdout.splitlines()[2:] == [
        "| CPU-tier sweep | 1x | TTFT change | -36.3% | -35.0% |",
        "| CPU-tier sweep | 2x | (new row) | - | - |",
        "| CPU-tier sweep | 8x | (row gone) | - | - |",
    ]
