"""The documentation's Python code blocks run as written, as the README's do (tests/test_readme.py).

Every ```` ```python ```` block of a page under docs/ runs, in page order and in one namespace
per page (a later block may use what an earlier one defined), in a fresh temporary working
directory, offline. Blocks that cannot run here (a running server, downloaded weights, MPI
or a cluster) are written as ```` ```py ```` (highlighted the same) or preceded by a line
``<!-- not run: REASON -->``; they must still parse.

NOTE [runnable docs]: a block proves itself with ``assert``s against values computed
independently inside it (NumPy, plain Python), so a test here fails when what the page
says stops being true, not only when the code raises.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap
import types
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(
    r"(?P<skip><!--\s*not run:[^>]*-->\s*\n)?^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```",
    flags=re.S | re.M,
)


class Block(NamedTuple):
    """One fenced code block of a page."""

    page: str
    line: int  # lines of the page above the code (a traceback then names page lines)
    lang: str
    info: str
    code: str
    runs: bool


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    text = path.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        code = textwrap.dedent(m.group("body"))
        lang = m.group("lang")
        runs = lang == "python" and m.group("skip") is None
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        found.append(Block(name, text.count("\n", 0, m.start("body")), lang, m.group("info"), code, runs))
    return found


PAGES = sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)
RUNNABLE = [p for p in PAGES if any(b.runs for b in blocks(p))]


def test_the_guides_have_runnable_blocks() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in RUNNABLE}
    expected = {
        "guides/getting-started.md",
        "guides/training.md",
        "guides/serving.md",
        "guides/backend-plugin.md",
        "guides/model-family-plugin.md",
        "guides/quantization-gguf.md",
        "guides/debugging.md",
    }
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_python_blocks_parse(page: Path) -> None:
    for block in blocks(page):
        if block.lang in ("python", "py"):
            ast.parse(block.code, filename=f"{block.page}:{block.line}")


#: Pages whose ```python blocks are sketches that cannot run yet, with what to do: the page's
#: author marks those blocks ```py (or makes them run) and deletes the entry here. xfail is
#: strict, so a page that starts to pass fails here until its entry goes.
NOT_YET_RUNNABLE: dict[str, str] = {}


def _run_param(page: Path) -> object:
    name = page.relative_to(DOCS).as_posix()
    reason = NOT_YET_RUNNABLE.get(name)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(page, id=name, marks=marks)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [_run_param(p) for p in RUNNABLE])
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kael_debug")
    pytest.importorskip("kael_server")
    monkeypatch.chdir(tmp_path)
    # the page's blocks run in a real module (dataclasses and pickling look their module up)
    module = types.ModuleType("kael_docs_page", f"The code blocks of {page.name}.")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in blocks(page):
        if not block.runs:
            continue
        # line numbers in a traceback are the page's: pad the code with the lines above it
        code = compile("\n" * block.line + block.code, block.page, "exec", dont_inherit=True)
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, module.__dict__)


def test_a_failing_block_fails_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- not run: demo -->\n```python\nraise SystemExit\n```\n\n"
        "```py\nraise SystemExit\n```\n\n```python\nassert x == 2\n```\n",
        encoding="utf-8",
    )
    found = blocks(page)
    assert [(b.lang, b.runs) for b in found] == [("python", True), ("python", False), ("py", False), ("python", True)]
    assert found[3].line == 16  # lines above its code: a traceback names page line 17
    namespace: dict[str, object] = {}
    exec(found[0].code, namespace)
    with pytest.raises(AssertionError):
        exec(found[3].code, namespace)


def _titled(page: str, title: str) -> str:
    """The code of the block of ``page`` whose fence carries ``title="TITLE"``."""
    found = [b.code for b in blocks(DOCS / page) if f'title="{title}"' in b.info]
    assert len(found) == 1, f"{page}: expected one block titled {title!r}, found {len(found)}"
    return found[0]


@pytest.mark.timeout(900)
def test_the_backend_guides_plugin_passes_the_conformance_kit(tmp_path: Path) -> None:
    """The backend guide's plugin.py, installed under its entry point, passes the whole kit."""
    site = tmp_path / "site"
    package = site / "my_backend"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "plugin.py").write_text(_titled("guides/backend-plugin.md", "my_backend/plugin.py"), encoding="utf-8")
    info = site / "my_backend-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-backend\nVersion: 0.1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[kael.backends]\nmy-backend = my_backend.plugin\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAEL_") and k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    plugin = [] if metadata.entry_points(group="pytest11", name="kael_testing") else ["-p", "kael_pytest"]
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "kael.testing.conformance", "--kael-backend", "my-backend"]
    cmd += ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", *plugin]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "kael backend: 'my-backend' for device type 'cpu' (priority 1" in out
    summary = r.stdout.strip().splitlines()[-1]  # pytest's own summary line (stderr may end with a plugin's warning)
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
