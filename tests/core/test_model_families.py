"""The model-family seam (kael/models/_registry.py, _protocol.py, _base.py, _steps.py).

A third-party family, ``tests/plugins/kael_toy`` (kael's public API only), is installed the
way pip would install it: a copy of the package next to a ``.dist-info`` directory whose
``entry_points.txt`` registers it under ``kael.models``. With no change to kael it then
loads through ``kael.models.from_pretrained``, generates with a KV cache (checked against
recomputing every position without one), decodes batched exactly as alone, runs in
``python -m kael generate``, and is served by ``kael-server --data DIR``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kael
import numpy as np
import pytest
from kael.models import (
    BatchDecoder,
    CausalLM,
    GenericStep,
    ModelFamily,
    families,
    from_pretrained,
    get_family,
    model_type_of,
    register_family,
    unregister_family,
)

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "plugins" / "kael_toy"
TINY = ROOT / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny"
sys.path.insert(0, str(ROOT / "tests" / "server"))
from processes import free_port, server_process  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding kael-toy as pip would install it (package + dist-info with the entry point)."""
    root = tmp_path_factory.mktemp("site")
    shutil.copytree(TOY, root / "kael_toy", ignore=shutil.ignore_patterns("__pycache__"))
    info = root / "kael_toy-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kael-toy\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[kael.models]\ntoy = kael_toy.plugin\n")
    return root


@pytest.fixture(scope="module")
def toy(site: Path) -> Any:
    sys.path.insert(0, str(site))
    try:
        import kael_toy

        yield kael_toy
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m == "kael_toy" or m.startswith("kael_toy.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def checkpoint(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kael-toy checkpoint with random weights and kael-tiny's byte-level tokenizer (257 tokens)."""
    config = toy.ToyConfig(vocab_size=257, hidden_size=32, num_layers=3, num_heads=4, max_position_embeddings=48)
    kael.manual_seed(7)
    model = toy.ToyLM(config)
    rng = np.random.default_rng(7)
    with kael.no_grad():  # larger weights than nn's default init, so greedy tokens differ from step to step
        for _, p in model.named_parameters():
            p.copy_(kael.from_numpy(rng.normal(0, 0.5, p.shape).astype(np.float32)))
    directory = tmp_path_factory.mktemp("toy") / "kael-toy"
    toy.save(model, directory)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(TINY / name, directory / name)
    return directory


def _greedy_without_cache(model: Any, prompt: list[int], n: int) -> list[int]:
    """The oracle: every step recomputes all positions with no cache and takes the argmax."""
    seq = list(prompt)
    with kael.no_grad():
        for _ in range(n):
            logits = model(kael.tensor([seq], dtype=kael.int64)).numpy()[0, -1]
            seq.append(int(np.argmax(logits)))
    return seq[len(prompt) :]


def test_the_toy_family_is_a_causal_lm_in_process(toy: Any, checkpoint: Path) -> None:
    model = toy.load(checkpoint)
    assert isinstance(model, CausalLM)
    assert model.decode_step(model.new_cache()) is None  # no fast step: the generic one runs it
    prompts = [[5, 6, 7], [100] * 9, [3], [200, 1, 2, 3, 4]]
    alone = [model.generate(p, 12) for p in prompts]
    for p, got in zip(prompts, alone):
        assert got == _greedy_without_cache(model, p, 12)
    assert len({tuple(a) for a in alone}) == len(alone)  # the prompts lead somewhere different
    # Batched: rows join at different steps, two prompts start in one prefill_many, one row is forked.
    engine = BatchDecoder(model, rows=5)
    assert isinstance(engine._step, GenericStep)
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    first = engine.prefill_many([3, 0], [prompts[0], prompts[1]])
    out[0].append(int(np.argmax(first.numpy()[0])))
    out[1].append(int(np.argmax(first.numpy()[1])))
    row = {0: 3, 1: 0}
    for step in range(12):
        if step == 2:
            out[2].append(int(np.argmax(engine.prefill(1, prompts[2]).numpy())))
            row[2] = 1
        if step == 4:
            out[3].append(int(np.argmax(engine.prefill(4, prompts[3]).numpy())))
            row[3] = 4
        live = [i for i in row if len(out[i]) < 12]
        if not live:
            break
        logits = engine.decode([row[i] for i in live], [out[i][-1] for i in live]).numpy()
        for j, i in enumerate(live):
            out[i].append(int(np.argmax(logits[j])))
    for i in range(len(prompts)):
        while len(out[i]) < 12:  # the late joiners finish alone
            out[i].append(engine.greedy(engine.decode([row[i]], [out[i][-1]]))[0])
        assert out[i] == alone[i], i


def test_a_plugin_family_loads_generates_and_runs_in_the_cli_with_no_change_to_kael(
    site: Path, checkpoint: Path, toy: Any
) -> None:
    script = textwrap.dedent(
        f"""
        import json
        import kael
        from kael.models import BatchDecoder, families, from_pretrained, model_type_of

        model = from_pretrained({str(checkpoint)!r})
        engine = BatchDecoder(model, rows=2)
        a = engine.prefill(1, [5, 6, 7])
        b = engine.prefill(0, [100] * 9)
        step = engine.decode([0, 1], [1, 2]).numpy()
        alone = BatchDecoder(model, rows=1)
        alone.prefill(0, [5, 6, 7])
        print(json.dumps({{
            "type": type(model).__module__ + "." + type(model).__name__,
            "families": sorted(families()),
            "model_type": model_type_of({str(checkpoint)!r}),
            "greedy": model.generate([5, 6, 7], 12),
            "batched_row_equals_alone": step[1].tolist() == alone.decode([0], [2]).numpy()[0].tolist(),
        }}))
        """
    )
    env = {**_env(), "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["type"] == "kael_toy._model.ToyLM"
    # kael's own families (this process's registry, where the toy fixture registered the plugin's too)
    assert got["families"] == sorted({*families(), "kael_toy"})
    assert got["model_type"] == "kael_toy"
    assert got["greedy"] == _greedy_without_cache(toy.load(checkpoint), [5, 6, 7], 12)
    assert got["batched_row_equals_alone"]
    cli = subprocess.run(
        [sys.executable, "-m", "kael", "generate", "--model", str(checkpoint), "def f", "--max-tokens", "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    tokenizer = kael.BpeTokenizer.from_directory(checkpoint)
    ids = toy.load(checkpoint).generate(tokenizer.encode("def f"), 8)
    if tokenizer.eot_token in ids:
        ids = ids[: ids.index(tokenizer.eot_token)]
    assert cli.stdout.rstrip("\n") == tokenizer.decode_text(ids)
    info = subprocess.run([sys.executable, "-m", "kael", "info"], capture_output=True, text=True, env=env, timeout=120)
    assert info.returncode == 0, info.stderr
    assert "kael.models" in info.stdout and "kael_toy     -            kael-toy (a test family)" in info.stdout
    # Without the plugin on the path the model_type is unknown, and the error says what is installed.
    bare = subprocess.run(
        [sys.executable, "-c", f"import kael.models as m; m.from_pretrained({str(checkpoint)!r})"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert bare.returncode != 0
    assert (
        "no model family serves model_type 'kael_toy'" in bare.stderr
        and str(sorted(set(families()) - {"kael_toy"})) in bare.stderr
    )


@pytest.fixture
def served_toy(site: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PYTHONPATH", str(site))
    port = free_port()
    command = [shutil.which("kael-server") or sys.executable]
    if command[0] == sys.executable:
        command += ["-m", "kael_server.cli"]
    command += ["--data", str(checkpoint), "--port", str(port), "--slots", "2"]
    with server_process(command, port):
        yield f"http://127.0.0.1:{port}"


def test_kael_server_serves_a_plugin_family(served_toy: str, checkpoint: Path, toy: Any) -> None:
    tokenizer = kael.BpeTokenizer.from_directory(checkpoint)
    model = toy.load(checkpoint)
    with httpx.Client(base_url=served_toy, timeout=60) as client:
        for prompt in ("def f", "import os\n"):
            body = {"model": "kael-toy", "prompt": prompt, "max_tokens": 10, "temperature": 0}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            ids = model.generate(tokenizer.encode(prompt), 10)
            if tokenizer.eot_token in ids:
                ids = ids[: ids.index(tokenizer.eot_token)]
            assert response.json()["choices"][0]["text"] == tokenizer.decode_text(ids)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# -- the registry itself -------------------------------------------------------------------------


def test_gpt2_is_built_in_and_found_by_model_type(tmp_path: Path) -> None:
    assert "gpt2" in families()
    model = kael.GPT(97, 16, 1, 2, 8)
    model.save_pretrained(tmp_path)
    assert model_type_of(tmp_path) == "gpt2"
    loaded = from_pretrained(tmp_path)
    assert isinstance(loaded, kael.GPT) and isinstance(loaded, CausalLM)
    ids = kael.tensor([[1, 2, 3]])
    with kael.no_grad():
        # a copy-mode load stores the projections out-major (NOTE [conv1d layout]): equal up to rounding
        np.testing.assert_allclose(loaded(ids).numpy(), model(ids).numpy(), rtol=0, atol=1e-6)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["model_type"]  # older exports: GPT-2
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_type_of(tmp_path) == "gpt2"


def test_register_family_by_hand(toy: Any, checkpoint: Path) -> None:
    family = ModelFamily("kael_toy_manual", toy.load)
    register_family(family)
    try:
        assert get_family("kael_toy_manual") is family
        with pytest.raises(kael.PluginError, match="already served"):
            register_family(ModelFamily("kael_toy_manual", toy.load))
        register_family(ModelFamily("kael_toy_manual", toy.load, "again"), replace=True)
        assert get_family("kael_toy_manual").description == "again"
    finally:
        unregister_family("kael_toy_manual")
    assert "kael_toy_manual" not in families()


def test_registry_errors(tmp_path: Path) -> None:
    with pytest.raises(kael.KaelError, match="no model family serves model_type 'nope'"):
        get_family("nope")
    with pytest.raises(kael.PluginError, match="model_type must be a non-empty string"):
        ModelFamily("", lambda d: d)
    with pytest.raises(kael.PluginError, match="load must be callable"):
        ModelFamily("x", 3)  # type: ignore[arg-type]
    with pytest.raises(kael.PluginError, match="expected a kael.models.ModelFamily"):
        register_family("gpt2")  # type: ignore[arg-type]
    with pytest.raises(kael.FormatError, match="not a directory"):
        from_pretrained(tmp_path / "missing")
    with pytest.raises(kael.FormatError, match="cannot read it"):
        model_type_of(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(kael.FormatError, match="expected a JSON object"):
        model_type_of(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": 3}')
    with pytest.raises(kael.FormatError, match="model_type must be a non-empty string, got 3"):
        model_type_of(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff")
    with pytest.raises(kael.FormatError, match="not UTF-8 JSON"):
        model_type_of(tmp_path)


def test_a_plugin_returning_garbage_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from kael.backends import register

    class Bad:
        @kael.hookimpl
        def kael_model_families(self) -> list[Any]:
            return ["not a family"]

    register(Bad(), "bad-family-plugin")
    try:
        with pytest.raises(kael.PluginError, match="'bad-family-plugin' returned 'not a family'"):
            families()
    finally:
        from kael._plugins import manager

        manager.unregister("bad-family-plugin")


def test_every_gguf_architecture_belongs_to_one_family() -> None:
    from kael.models._gguf import architectures

    claimed = [a for fam in families().values() for a in fam.gguf_architectures]
    assert len(claimed) == len(set(claimed)), claimed
    assert sorted(claimed) == sorted(architectures())
    assert families()["gpt2"].gguf_architectures == ("gpt2",) and families()["mistral"].gguf_architectures == ()
    with pytest.raises(kael.PluginError, match="gguf_architectures must be a tuple of non-empty strings"):
        ModelFamily("x", lambda d: d, gguf_architectures=["llama"])  # type: ignore[arg-type]
    with pytest.raises(kael.PluginError, match="gguf_architectures must be a tuple of non-empty strings"):
        ModelFamily("x", lambda d: d, gguf_architectures=("",))


def test_python_m_kael_info_lists_families_with_their_gguf_names() -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kael", "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("model families (config.json model_type, GGUF general.architecture):\n")[1].splitlines()
    rows = {ln.split()[0]: ln.split()[1] for ln in lines if ln.startswith("  ")}
    built_in = {name: fam for name, fam in families().items() if fam.load.__module__.startswith("kael.models.")}
    assert {"gpt2", "llama", "qwen3"} <= set(built_in)
    for name, fam in built_in.items():
        assert rows[name] == (", ".join(fam.gguf_architectures) or "-"), (name, rows.get(name))
