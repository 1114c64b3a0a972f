"""kael-debug: explain, DOT export, backward trace, anomaly detection, profiler."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading

import kael
import numpy as np
import pytest

kael_debug = pytest.importorskip("kael_debug")


def _fields(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.strip().splitlines())


def test_explain_float64_2x3():
    t = kael.zeros(2, 3, dtype=kael.float64)
    f = _fields(kael_debug.explain(t))
    assert f["shape"] == "[2, 3]"
    assert f["strides"] == "[3, 1]"
    assert f["offset"] == "0"
    assert f["dtype"] == "float64"
    assert f["contiguous"] == "yes"
    assert re.fullmatch(r"0x[0-9a-f]+, 48 bytes, version 0, references: 1", f["storage"])
    assert (f["requires_grad"], f["leaf"], f["has grad"]) == ("no", "yes", "no")
    assert "grad_fn" not in f


def test_explain_view_matches_the_issue_example():
    x = kael.rand(4, 4)
    v = x.T[1:3]
    text = kael_debug.explain(v)
    lines = text.splitlines()
    assert lines[:6] == [
        "shape: [2, 4]",
        "strides: [1, 4]",
        "offset: 1",
        "dtype: float32",
        "device: cpu",
        "contiguous: no",
    ]
    assert re.fullmatch(r"storage: 0x[0-9a-f]+, 64 bytes, version 0, references: 2", lines[6])
    assert lines[7:] == ["requires_grad: no", "leaf: yes", "has grad: no"]
    assert kael_debug.explain(x.slice(1, 1, 3)).splitlines()[:3] == ["shape: [4, 2]", "strides: [4, 1]", "offset: 1"]


def test_explain_reports_version_and_grad_fn():
    a = kael.tensor([1.0, 2.0], requires_grad=True)
    y = a * a
    f = _fields(kael_debug.explain(y))
    assert f["grad_fn"] == "MulBackward"
    assert f["leaf"] == "no" and f["requires_grad"] == "yes"
    b = kael.zeros(3)
    b.add_(1.0)
    assert "version 1," in kael_debug.explain(b)
    assert kael.debug.explain is kael_debug.explain


def test_kael_debug_is_found_through_the_plugin_manager_not_imported(tmp_path):
    """kael.debug asks the kael.plugins entry points (kael_namespace hook); blocked, it names the fix."""
    import subprocess
    import sys

    code = (
        "import sys, kael\n"
        "assert 'kael_debug' not in sys.modules\n"
        "print(kael.debug.explain(kael.ones(1)).splitlines()[0])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "shape: [1]", r.stderr
    blocked = "import kael\ntry:\n    kael.debug.explain\nexcept kael.PluginError as e:\n    print(e)\n"
    env = {**__import__("os").environ, "KAEL_BLOCK_PLUGINS": "debug"}
    r = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120, env=env)
    assert "kael.debug needs a debug plugin: pip install kael-debug" in r.stdout, r.stdout + r.stderr


def test_profiler_counts_the_bytes_of_the_outputs_the_frontend_allocated():
    a = kael.ones(4, 3)
    p, g, m, v = kael.ones(6), kael.ones(6), kael.zeros(6), kael.zeros(6)
    with kael_debug.profile() as prof:
        kael.layer_norm(a, 3)  # out [4, 3] + mean [4] + rstd [4], float32
        kael.adamw_step(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)  # in place: allocates nothing
    by_name = {e.name: e.bytes for e in prof.events}
    assert by_name["layer_norm"] == (12 + 4 + 4) * 4
    assert by_name.get("adamw_step", 0) == 0


def test_dot_for_sum_of_square_is_exact():
    x = kael.tensor([1.0, 2.0], requires_grad=True)
    assert kael_debug.autograd_graph_dot(kael.sum(x * x)) == (
        "digraph autograd {\n"
        '  n0 [label="SumBackward"];\n'
        '  n1 [label="MulBackward"];\n'
        '  n0 -> n1 [label="[2]"];\n'
        '  n2 [label="AccumulateGrad"];\n'
        '  n1 -> n2 [label="[2]"];\n'
        '  n1 -> n2 [label="[2]"];\n'
        "}\n"
    )


def test_dot_for_sum_of_a_times_a_plus_a():
    a = kael.rand(3, requires_grad=True)
    dot = kael_debug.autograd_graph_dot(kael.sum(a * a + a))
    labels = set(re.findall(r'label="([A-Za-z]+)"', dot))
    assert labels == {"SumBackward", "AddBackward", "MulBackward", "AccumulateGrad"}
    assert len(re.findall(r"->", dot)) == 5


def test_dot_without_graph():
    assert kael_debug.autograd_graph_dot(kael.ones(2)) == "digraph autograd {\n}\n"


def test_render_graph_errors_clearly_without_dot_or_bad_suffix(tmp_path, monkeypatch):
    a = kael.rand(2, requires_grad=True)
    with pytest.raises(kael.KaelError, match="png or .svg"):
        kael_debug.render_graph(a.sum(), tmp_path / "g.pdf")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(kael.KaelError, match="Graphviz"):
        kael_debug.render_graph(a.sum(), tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()


def _trace(fn):
    buf = io.StringIO()
    kael_debug.set_backward_trace(buf)
    try:
        fn()
    finally:
        kael_debug.set_backward_trace(None)
    return buf.getvalue()


def test_backward_trace_lines_and_norms():
    w = kael.tensor([3.0, 3.0], requires_grad=True)
    out = _trace(lambda: kael.sum(w * w).backward())
    assert out == (
        "backward SumBackward shape=[] norm=1\n"
        "backward MulBackward shape=[2] norm=1.41421\n"
        "backward AccumulateGrad shape=[2] norm=8.48528\n"
    )
    x = kael.tensor([3.0, 3.0], requires_grad=True)
    out = _trace(lambda: kael.sum(x * 2.0).backward())
    assert out.splitlines()[-1] == "backward AccumulateGrad shape=[2] norm=2.82843"


def test_trace_and_anomaly_are_off_by_default():
    assert not kael_debug.is_anomaly_enabled()
    assert not kael.backends.hooks_registered("kael_debug.hooks")
    x = kael.tensor([-1.0], requires_grad=True)
    kael.sqrt(x).sum().backward()  # NaN gradient, no error when off
    assert np.isnan(x.grad.numpy()).all()


def test_anomaly_names_the_node():
    x = kael.tensor([-1.0], requires_grad=True)
    with kael_debug.detect_anomaly():
        with pytest.raises(kael.KaelError, match="Function SqrtBackward returned NaN in its gradient"):
            kael.sum(kael.sqrt(x)).backward()
    assert not kael_debug.is_anomaly_enabled()
    y = kael.tensor([4.0], requires_grad=True)
    with kael_debug.detect_anomaly():
        kael.sum(kael.sqrt(y) * y).backward()  # clean graph: no false positive
    assert y.grad.tolist() == pytest.approx([3.0])


def test_switching_while_another_thread_runs_backward():
    errors = []

    def work():
        try:
            for _ in range(50):
                w = kael.rand(8, requires_grad=True)
                kael.sum(kael.tanh(w) * w).backward()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    for i in range(50):
        kael_debug.set_anomaly_detection(i % 2 == 0)
    kael_debug.set_anomaly_detection(False)
    t.join()
    assert errors == []


def test_trace_env_var_turns_it_on_at_start(tmp_path):
    code = "import kael; w = kael.tensor([3.0, 3.0], requires_grad=True); kael.sum(w * w).backward()"
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "KAEL_TRACE_BACKWARD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "backward AccumulateGrad shape=[2] norm=8.48528" in r.stderr


def test_profiler_table_and_chrome_trace(tmp_path):
    a = kael.rand(4, 4)
    with kael_debug.profile() as prof:
        b = kael.matmul(a, a)
        kael.softmax(b, -1)
    names = [e.name for e in prof.events]
    assert "matmul" in names
    ev = next(e for e in prof.events if e.name == "matmul")
    assert ev.shapes == [[4, 4], [4, 4], [4, 4]] and ev.bytes == 64
    table = prof.table(sort_by="total")
    assert table.splitlines()[0].startswith("Name") and "matmul" in table
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    data = json.loads(path.read_text())
    assert len(data["traceEvents"]) == len(prof.events)
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in data["traceEvents"])
    # outside the block nothing is recorded and kernels are unwrapped
    kael.matmul(a, a)
    assert len(prof.events) == len(names)
    from kael import _dispatch

    assert _dispatch._wrapper is None
    assert kael.backends.dispatch.kernel("cpu", "matmul") is kael.backends.current("cpu").kernel("matmul")


def test_profiler_gpt2_forward_one_event_per_op(tmp_path):
    models = pytest.importorskip("kael.models")
    model = models.GPT(vocab_size=50, max_positions=16, layers=1, heads=2, dimension=8)
    ids = kael.tensor([[1, 2, 3]])
    with kael_debug.profile() as prof:
        with kael.no_grad():
            model(ids)
    path = tmp_path / "gpt.json"
    prof.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert len(events) == len(prof.events) > 5
    assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(events[0])
