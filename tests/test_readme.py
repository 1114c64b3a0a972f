"""The README's Python examples run as written (those that need no server or downloaded weights;
.ci/run exercises the server commands against a running kael-server)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
LOCAL = [b for b in BLOCKS if "127.0.0.1" not in b and "weights/" not in b]


def test_readme_has_the_two_commands():
    text = README.read_text(encoding="utf-8")
    shell = re.findall(r"```sh\n(.*?)```", text.split("## From clone")[0], flags=re.S)
    assert [s.strip() for s in shell] == [
        "python -m pip install ./kael_core ./kael_backend_cpu ./kael_server && kael-server",
        "./scripts/test.sh",
    ]


@pytest.mark.parametrize("code", LOCAL, ids=[f"block{i}" for i in range(len(LOCAL))])
def test_python_block_runs(code: str) -> None:
    pytest.importorskip("kael_debug")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    text = out.getvalue()
    if "detect_anomaly" in code:
        assert "Function SqrtBackward returned NaN in its gradient" in text
        assert "backward SumBackward shape=[] norm=1" in text
        assert text.count("digraph autograd {") == 1
    else:
        assert float(text.strip().splitlines()[-1]) > 0
