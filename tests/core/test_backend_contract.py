"""The public backend contract (``kael.backends`` and its sub-modules) does what its docs say.

* No plugin, nor the conformance kit, imports a private kael module (the issue's acceptance
  check, done on the syntax tree so ``from kael import _x`` and relative imports count too),
  no plugin imports another backend, and the frontend imports no plugin package.
* The catalogue describes the kernels: each host kernel's parameters are its ``OpDef.args``.
* The host helpers against independent oracles: bfloat16 rounding against PyTorch, the
  random kernels against NumPy's PCG64 stream for the generator's seed.
* ``memory``, ``dispatch``, hook registration and ``autograd.get_gradient_edge`` behave as
  documented, with clear errors for bad input.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael.backends import catalogue, dispatch, dtypes, host, memory
from kael.backends.reference import ReferenceBackend

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = {
    "kael_backend_cpu": ROOT / "kael_backend_cpu/src/kael_backend_cpu",
    "kael_backend_cuda": ROOT / "kael_backend_cuda/src/kael_backend_cuda",
    "kael_debug": ROOT / "kael_debug/src/kael_debug",
    "kael_server": ROOT / "kael_server/src/kael_server",
}
KIT = ROOT / "kael_core/src/kael/testing"
PYTEST_PLUGIN = ROOT / "kael_core/src/kael_pytest.py"
FRONTEND = ROOT / "kael_core/src/kael"


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "kael" and any(p.startswith("_") and not p.endswith("__") for p in parts[1:])


def _imports(path: Path, package: str, src: Path = ROOT / "kael_core/src") -> list[tuple[str, int]]:
    """(absolute module, line) of every import outside `if TYPE_CHECKING:`; `from X import y` gives X and X.y.

    Relative imports inside kael (a file under `src`) are resolved to absolute names.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(src) if package == "kael" else None
    here = list(rel.with_suffix("").parts) if rel is not None else []
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package != "kael":  # a plugin's own relative imports stay inside the plugin
                    return
                base = here[: len(here) - node.level] if here[-1] != "__init__" else here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((mod, node.lineno))
            found.extend((f"{mod}.{a.name}", node.lineno) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _sources(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_plugins_import_only_public_kael_modules() -> None:
    bad = []
    for name, folder in PLUGINS.items():
        for path in _sources(folder):
            for mod, line in _imports(path, name):
                if _private(mod) or mod.startswith("kael.backends.reference"):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "plugins import private kael modules or the reference backend:\n" + "\n".join(bad)


def test_conformance_kit_imports_only_public_kael_modules() -> None:
    bad = []
    for path in [*_sources(KIT), PYTEST_PLUGIN]:
        for mod, line in _imports(path, "kael"):
            if _private(mod) and not mod.startswith("kael.testing"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "kael.testing / kael_pytest import private kael modules:\n" + "\n".join(bad)


def test_the_checker_sees_relative_and_from_kael_private_imports(tmp_path: Path) -> None:
    probe = tmp_path / "kael/testing/conformance/_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from ... import _dtype\nfrom kael import _dispatch\nfrom ..._tensor import Tensor\nimport kael.ops._core\n"
    )
    mods = {m for m, _ in _imports(probe, "kael", src=tmp_path)}
    assert {"kael._dtype", "kael._dispatch", "kael._tensor", "kael.ops._core"} <= mods
    assert all(_private(m) for m in ("kael._dtype", "kael.ops._core", "kael.backends.host._io"))
    assert not any(_private(m) for m in ("kael.backends.host", "kael.testing", "kael"))


def test_frontend_imports_no_plugin_package() -> None:
    bad = []
    for path in _sources(FRONTEND):
        for mod, line in _imports(path, "kael"):
            if mod.split(".")[0] in PLUGINS:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "the frontend imports plugin packages:\n" + "\n".join(bad)


def test_frontend_ops_never_import_the_reference_backend() -> None:
    bad = []
    for sub in ("ops", "nn", "autograd", "models", "optim", "io"):
        for path in _sources(FRONTEND / sub):
            for mod, line in _imports(path, "kael"):
                if mod.startswith("kael.backends.reference"):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "\n".join(bad)


# -- the module itself ------------------------------------------------------------------------------


def test_api_version_and_public_names() -> None:
    assert kael.backends.API_VERSION == "1.4"
    for mod in (kael.backends, catalogue, dtypes, host, memory, dispatch):
        assert mod.__doc__ and len(mod.__doc__) > 200, f"{mod.__name__} needs a docstring for plugin authors"
        missing = [n for n in mod.__all__ if not hasattr(mod, n)]
        assert not missing, f"{mod.__name__}.__all__ names missing attributes: {missing}"
        for n in mod.__all__:
            obj = getattr(mod, n)
            if inspect.isfunction(obj):
                assert obj.__doc__, f"{mod.__name__}.{n} has no docstring"


# -- catalogue --------------------------------------------------------------------------------------


def test_every_host_kernel_takes_its_catalogue_arguments() -> None:
    """The reference kernels are written against the signatures: names in order (variadic: arity)."""
    for name, d in catalogue.CATALOGUE.items():
        k = host.kernel(name)
        params = list(inspect.signature(k).parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in params):  # the pointwise kernels: kernel(out, *inputs)
            assert d.pointwise is not None and d.arity == (1, len(d.args) - 1), name
            continue
        assert [p.name for p in params] == [a.name for a in d.args], f"{name}: {d.signature}"


def test_signatures_arity_and_attributes() -> None:
    ln = catalogue.op("layer_norm")
    assert ln.signature == "layer_norm(out, mean, rstd, x, weight|None, bias|None, eps: float)"
    assert ln.kind == "fused" and ln.arity == (3, 3) and ln.attributes == ("eps",)
    assert ln.outputs == ("out", "mean", "rstd") and ln.inputs == ("x", "weight", "bias") and ln.allocated == (0, 1, 2)
    adam = catalogue.op("adamw_step")
    assert adam.outputs == ("param", "exp_avg", "exp_avg_sq") and adam.inputs == ("grad",) and adam.allocated == ()
    assert adam.attributes == ("lr", "beta1", "beta2", "eps", "weight_decay", "step")
    assert catalogue.op("cat").signature == "cat(out, tensors: list[Tensor], dim: int)"
    assert catalogue.op("index_add").arity == (1, 2) and catalogue.op("index_add").allocated == ()
    assert catalogue.op("silu").signature == "silu(out, x)" and catalogue.op("silu").kind == "fused"
    assert catalogue.op("sum").attributes == ("dims",)
    for d in catalogue.CATALOGUE.values():
        assert d.kind in ("primitive", "fused") and d.signature.startswith(f"{d.name}(")
        assert all(a.role in ("out", "inout", "in", "attr") for a in d.args), d.name
        assert sum(d.arity) + len(d.attributes) == len(d.args), d.name


def test_families_partition_the_catalogue() -> None:
    assert catalogue.PRIMITIVES.isdisjoint(catalogue.FUSED)
    assert catalogue.PRIMITIVES | catalogue.FUSED == set(catalogue.CATALOGUE)
    assert set(catalogue.UNARY_OPS + catalogue.BINARY_OPS + catalogue.COMPARE_OPS) <= catalogue.PRIMITIVES
    assert set(catalogue.POINTWISE_OPS) == set(
        catalogue.UNARY_OPS + catalogue.BINARY_OPS + catalogue.COMPARE_OPS + catalogue.POINTWISE_FUSED
    )
    assert set(catalogue.POINTWISE_FUSED) <= catalogue.FUSED and "silu" in catalogue.POINTWISE_FUSED
    assert set(catalogue.REDUCE_OPS) <= catalogue.PRIMITIVES


def test_lookup_errors_name_the_op() -> None:
    with pytest.raises(kael.BackendError, match="unknown op 'nope'"):
        catalogue.op("nope")
    with pytest.raises(kael.BackendError, match="'add' is a primitive"):
        catalogue.decomposition("add")
    with pytest.raises(kael.BackendError, match="'adamw_step' has no decomposition"):
        catalogue.decomposition("adamw_step")
    assert catalogue.op("sum").args[-1] == catalogue.Arg("dims", "attr", "tuple[int, ...]")


def test_every_fused_op_but_the_optimizer_step_has_a_decomposition() -> None:
    # adamw_step is an in-place update; layer_norm_backward is written out inside LayerNorm's backward
    assert set(catalogue.decompositions()) == catalogue.FUSED - {"adamw_step", "layer_norm_backward"}
    x = kael.tensor([[-1.5, 0.0, 2.0]], dtype=kael.float64)
    want = np.array([[-1.5, 0.0, 2.0]]) / (1 + np.exp(-np.array([[-1.5, 0.0, 2.0]])))
    np.testing.assert_allclose(catalogue.decomposition("silu")(x).numpy(), want, rtol=1e-15)


def test_pointwise_definitions_agree_with_numpy_ufuncs() -> None:
    """Where an entry gives both a ufunc and an expression (round), they compute the same values."""
    v = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -3.7])
    for name in catalogue.POINTWISE_OPS:
        p = catalogue.op(name).pointwise
        assert p is not None and (p.ufunc or p.expr is not None), name
        if p.ufunc and p.expr is not None and catalogue.op(name).arity[1] == 1:
            np.testing.assert_array_equal(p.compute(np, v), getattr(np, p.ufunc)(v), err_msg=name)


# -- dtypes -----------------------------------------------------------------------------------------


def test_dtype_tables() -> None:
    assert [d.name for d in dtypes.ALL_DTYPES] == [
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
    ]
    for d in dtypes.ALL_DTYPES:
        assert dtypes.by_name(d.name) is d is dtypes.BY_NAME[d.name]
        assert d.itemsize == d.np.itemsize
        assert d.is_floating_point == (d.category == dtypes.FLOATING)
    assert dtypes.bfloat16.np == np.uint16 and dtypes.float16.np == np.float16
    assert dtypes.FLOATING_DTYPES == (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
    assert dtypes.from_numpy_dtype(np.dtype(np.int16)) is dtypes.int16
    with pytest.raises(kael.DTypeError, match="unknown dtype 'float8'.*expected one of"):
        dtypes.by_name("float8")


# -- host -------------------------------------------------------------------------------------------


def test_bf16_rounding_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(2000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 2000),
            np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.0e38, 1e-40], np.float32),
        ]
    ).astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = host.f32_to_bf16_bits(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(host.bf16_bits_to_f32(want), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    assert np.isnan(host.bf16_bits_to_f32(host.f32_to_bf16_bits(np.float32(np.nan))))
    assert host.bf16_bits_to_f32(np.uint16(0x3F80)).shape == ()  # 0-d stays an array


def test_view_read_write_honour_strides_and_bfloat16() -> None:
    t = kael.zeros(4, 6, dtype=kael.bfloat16)
    v = t[1:, ::2]
    host.write(v, np.arange(9, dtype=np.float32).reshape(3, 3) + 0.5)
    assert host.view(v).dtype == np.uint16 and host.view(v).strides == (12, 4)
    np.testing.assert_array_equal(host.read(v), np.arange(9).reshape(3, 3) + 0.5)
    np.testing.assert_array_equal(host.read(t)[0], 0)
    assert host.compute_dtype(dtypes.bfloat16) == np.float32 and host.compute_dtype(dtypes.float16) == np.float16


@pytest.mark.parametrize(
    ("op", "a", "b", "draw"),
    [
        ("uniform", -2.0, 3.0, lambda g, s: -2.0 + 5.0 * g.random(s)),
        ("normal", 1.0, 0.5, lambda g, s: 1.0 + 0.5 * g.standard_normal(s)),
        ("randint", 3, 9, lambda g, s: g.integers(3, 9, size=s)),
    ],
)
def test_random_kernels_draw_the_generators_pcg64_stream(op: str, a: Any, b: Any, draw: Any) -> None:
    out = kael.empty(5, 7, dtype=kael.float64 if op != "randint" else kael.int64)
    host.RANDOM_KERNELS[op](out, a, b, kael.Generator().manual_seed(1234))
    np.testing.assert_array_equal(out.numpy(), draw(np.random.Generator(np.random.PCG64(1234)), (5, 7)))
    assert host.RANDOM_KERNELS[op] is getattr(host, op)


def test_host_kernel_library_is_what_the_reference_backend_serves() -> None:
    ref = ReferenceBackend()
    assert set(host.kernels()) == set(catalogue.CATALOGUE) == set(ref.supported_ops())
    for op in catalogue.CATALOGUE:
        assert ref.kernel(op) is host.kernel(op)
    assert set(ReferenceBackend(fused=False).supported_ops()) == catalogue.PRIMITIVES
    with pytest.raises(kael.BackendError, match="no host kernel for op 'conv3d'"):
        host.kernel("conv3d")


# -- memory -----------------------------------------------------------------------------------------


def test_wrap_buffer_shares_the_memory_it_is_given() -> None:
    buf = np.zeros(10 * 4, np.uint8)
    t = memory.wrap_buffer(buf, buf.nbytes, kael.device("cpu"), (3, 2), (3, 1), dtypes.float32, offset=1)
    buf.view(np.float32)[[1, 2, 4, 5, 7, 8]] = [1, 2, 3, 4, 5, 6]
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]] and t.stride() == (3, 1) and t.storage_offset() == 1
    assert memory.buffer(t) is buf and memory.storage(t).nbytes == 40 and memory.storage(t) is t.untyped_storage()
    u = memory.wrap_buffer(buf, 40, kael.device("cpu"), (0, 5), (5, 1), dtypes.float32)
    assert u.shape == (0, 5) and u.numel() == 0
    assert memory.same_storage(t, t.T) and not memory.same_storage(t, t.clone())
    assert memory.contiguous_strides((2, 3, 4)) == (12, 4, 1) and memory.contiguous_strides((2, 0, 3)) == (3, 3, 1)


@pytest.mark.parametrize(
    ("shape", "strides", "offset", "match"),
    [
        ((3, 3), (3, 1), 2, "reaches byte 44, past the buffer's 40 bytes"),
        ((2,), (1, 1), 0, "of one length"),
        ((2,), (-1,), 0, "non-negative"),
        ((2,), (1,), -1, "non-negative"),
    ],
)
def test_wrap_buffer_rejects_views_outside_the_buffer(shape: Any, strides: Any, offset: int, match: str) -> None:
    buf = np.zeros(40, np.uint8)
    with pytest.raises(kael.ShapeError, match=match):
        memory.wrap_buffer(buf, 40, kael.device("cpu"), shape, strides, dtypes.float32, offset)


def test_cached_view_is_made_once_per_tensor() -> None:
    calls = []
    t = memory.wrap_buffer(np.zeros(8, np.uint8), 8, kael.device("cuda", 0), (2,), (1,), dtypes.float32)
    make = lambda x: calls.append(x) or object()  # noqa: E731
    assert memory.cached_view(t, make) is memory.cached_view(t, make) and len(calls) == 1


# -- dispatch and hooks -----------------------------------------------------------------------------


def test_dispatch_surface_and_kernel_wrapper() -> None:
    b = dispatch.backend_for("cpu")
    assert b is kael.backends.current("cpu")
    assert dispatch.kernel("cpu", "add") is b.kernel("add")
    seen: list[tuple[str, str, str]] = []

    def wrap(device_type: str, op: str, backend: Any, k: Any) -> Any:
        def run(*args: Any) -> Any:
            seen.append((device_type, op, backend.name))
            return k(*args)

        return run

    dispatch.set_kernel_wrapper(wrap)
    try:
        (kael.tensor([1.0, 2.0]) * 3.0).exp()
    finally:
        dispatch.set_kernel_wrapper(None)
    assert ("cpu", "mul", b.name) in seen and ("cpu", "exp", b.name) in seen
    assert dispatch.kernel("cpu", "add") is b.kernel("add")  # unwrapped again
    assert dispatch.fused_kernel("cpu", "silu") is (b.kernel("silu") if "silu" in b.supported_ops() else None)
    with pytest.raises(kael.BackendError, match="unknown op 'conv3d'"):
        dispatch.kernel("cpu", "conv3d")


def test_override_reports_use() -> None:
    prev = kael.backends.override("cpu")
    kael.backends.use("cpu", "reference")
    try:
        assert kael.backends.override("cpu") == "reference" and kael.backends.current("cpu").name == "reference"
    finally:
        kael.backends.use("cpu", prev)
    assert kael.backends.override("cpu") == prev


def test_hook_objects_observe_backward_while_registered() -> None:
    names: list[str] = []

    class Observer:
        @kael.hookimpl
        def kael_backward_node_pre(self, node: Any, grad_outputs: Any) -> None:
            names.append(node.name())

    x = kael.tensor([1.0, 2.0], requires_grad=True)
    kael.backends.register_hooks(Observer(), "test-observer")
    try:
        assert kael.backends.hooks_registered("test-observer")
        (x.exp() * 2).sum().backward()
    finally:
        kael.backends.unregister_hooks("test-observer")
    assert names[:3] == ["SumBackward", "MulBackward", "ExpBackward"] and names[-1] == "AccumulateGrad"
    assert not kael.backends.hooks_registered("test-observer")
    names.clear()
    (x * 2).sum().backward()
    assert names == []
    kael.backends.unregister_hooks("test-observer")  # again: nothing happens


# -- graph walking ----------------------------------------------------------------------------------


def test_gradient_edges_walk_the_graph() -> None:
    from kael.autograd import AccumulateGrad, GradientEdge, get_gradient_edge

    x = kael.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    leaf = get_gradient_edge(x)
    assert isinstance(leaf, GradientEdge) and isinstance(leaf.node, AccumulateGrad) and leaf.output_nr == 0
    assert get_gradient_edge(x).node is leaf.node and leaf.node.name() == "AccumulateGrad"
    y = (x * 2).sum(0)
    edge = get_gradient_edge(y)
    assert edge == (y.grad_fn, 0) and edge.node.name() == "SumBackward" and edge.node.input_shapes == ((2, 2),)
    (mul_edge,) = edge.node.next_functions
    assert mul_edge is not None and mul_edge[0].name() == "MulBackward"
    assert mul_edge[0].next_functions == ((leaf.node, 0),) and mul_edge[0].input_shapes == ((2, 2),)
    with pytest.raises(kael.AutogradError, match=r"shape \[3\] does not require grad"):
        get_gradient_edge(kael.ones(3))
    with pytest.raises(kael.AutogradError, match="expected a kael.Tensor, got list"):
        get_gradient_edge([1.0])  # type: ignore[arg-type]


# -- kael.debug reaches its plugin through the hook -------------------------------------------------


def test_kael_debug_is_served_by_the_kael_namespace_hook() -> None:
    import kael.debug

    class FakeDebug:
        @kael.hookimpl
        def kael_namespace(self, name: str) -> Any:
            return type("NS", (), {"explain": staticmethod(lambda t: "fake")}) if name == "debug" else None

    kael.backends.register_hooks(FakeDebug(), "test-fake-debug")
    try:
        assert kael.debug.explain(kael.ones(1)) == "fake"  # the most recently registered implementation answers
    finally:
        kael.backends.unregister_hooks("test-fake-debug")
    with pytest.raises(AttributeError):
        kael.debug.__wrapped__  # noqa: B018  (introspection never loads plugins)
