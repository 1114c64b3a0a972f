"""The README's Python examples run as written (those that need no server or downloaded weights;
.ci/run exercises the server commands against a running kael-server)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
LOCAL = [b for b in BLOCKS if "127.0.0.1" not in b and "weights/" not in b]


FIRST_COMMAND = (
    "python -m pip install ./kael_core ./kael_backend_cpu ./kael_server ./kael_debug openai tqdm && kael-server"
)


def test_readme_has_the_two_commands():
    text = README.read_text(encoding="utf-8")
    shell = re.findall(r"```sh\n(.*?)```", text.split("## From clone")[0], flags=re.S)
    assert [s.strip() for s in shell] == [FIRST_COMMAND, "./scripts/test.sh"]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _installed_by(requirements: list[str]) -> set[str]:
    """The distributions that installing ``requirements`` brings, with their dependencies (no extras)."""
    found: set[str] = set()
    todo = [Path(r).name if r.startswith("./") else r for r in requirements]
    while todo:
        name = _normal(todo.pop())
        if name in found:
            continue
        found.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def _imports(code: str) -> set[str]:
    """Top-level names of every module ``code`` imports (nested imports too)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__"}


def test_the_first_command_installs_what_the_examples_import():
    text = README.read_text(encoding="utf-8")
    scripts = sorted(set(re.findall(r"examples/\w+\.py", text)))
    assert "examples/train_gpt.py" in scripts
    codes = [*BLOCKS, *((ROOT / s).read_text(encoding="utf-8") for s in scripts)]
    needed = set().union(*map(_imports, codes))
    assert {"kael", "kael_debug", "openai", "tqdm"} <= needed
    installed = _installed_by(FIRST_COMMAND.split(" && ")[0].split()[4:])
    providers = metadata.packages_distributions()
    for module in needed:
        dists = {_normal(d) for d in providers.get(module, [module])}
        assert dists & installed, f"{module} ({dists}) is not installed by the README's first command"


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


def test_the_family_table_lists_every_built_in_family_with_its_gguf_names():
    """The README's model-family table names each built-in family's model_type and GGUF architectures
    (kael.models.families(), the records `python -m kael info` prints)."""
    import kael

    section = README.read_text(encoding="utf-8").split("## Model families", 1)[1].split("\n## ", 1)[0]
    rows = [r.split("|") for r in section.splitlines() if r.startswith("| ") and "`" in r.split("|")[2]]
    table = {r[2].strip().strip("`"): r[3].strip().strip("`") for r in rows if r[1].strip() != "Family"}
    built_in = {n: f for n, f in kael.models.families().items() if f.load.__module__.startswith("kael.models.")}
    assert set(table) == set(built_in)
    # a family whose files carry another family's architecture name says which: Mistral's are llama's, and a
    # multimodal Gemma 3's text model converts to gemma3 (which the gemma3_text family loads)
    other = {"mistral": "llama", "gemma3": "gemma3"}
    for name, fam in built_in.items():
        assert table[name] == (", ".join(fam.gguf_architectures) or other[name]), name
