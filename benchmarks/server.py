"""Benchmark kael-server: /health while a generation runs, time to first token, tokens/s of a stream;
and, with ``--load``, K concurrent streaming clients against a batching server.

    python benchmarks/server.py --url http://127.0.0.1:8000      # a server that is running
    python benchmarks/server.py --data tests/data/tiny-gpt2       # start kael-server, measure, stop
    python benchmarks/server.py --load --random-gpt2 small        # GPT-2 small, random weights, --slots 8
    python benchmarks/server.py --load --random-gpt2 4,4,256 --clients 1,2,4,8 --max-tokens 64
    python benchmarks/server.py --load --random-gpt2 small --weights q8_0 --llama-server   # and llama.cpp's
    python benchmarks/server.py --load --data model.gguf --llama-server build/llama.cpp/bin/llama-server
    python benchmarks/server.py --prefix 768 --random-gpt2 small  # a default server: a repeated prefix's TTFT

With ``--data`` a directory lacking vocab.json / merges.txt gets them from
tests/data/gpt2-tokenizer. ``--random-gpt2`` builds the checkpoint with kael (``small`` or
``LAYERS,HEADS,DIMENSION[,CONTEXT]``, GPT-2's vocabulary; nothing is downloaded). The load
mode starts the server with ``--slots`` (default 8) and a queue as deep, sweeps K over
``--passes`` passes (default 3), and reports for each K: aggregate tokens/s (all tokens over
the wall time of a pass; the median pass, and every pass), per-stream tokens/s after the first
token (median), p50/p99 time to first token, and errors. Prints one JSON object.

``--prefix N`` starts kael-server with no flags (its defaults) and times a one-token completion
of a fresh random N-token prefix plus 16 tokens, then of the same prefix with another 16
(``--streams`` rounds): the miss, the hit, the hit's ``cached_tokens`` and the miss/hit ratio
(benchmarks/_prefix_client.py).

``--weights S`` (any of kael-server's) is passed to the kael-server it starts. With
``--llama-server [PATH]`` (default: the binary ``scripts/build_llama_cpp.sh`` built into its cache,
found as the tests find it) the load mode also starts llama.cpp's server with as many
slots (``-np``) on the same GGUF file (``--data model.gguf``, or the random GPT-2 written as
GGUF by kael's ``save_gguf`` in ``--weights``' format) and runs the same sweep, the same
prompt and token counts, against it: its results are under ``"llama_server"``.
Every loop is bounded in time and count, and only loopback addresses are used when the
script starts the server itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from _llama_cpp_bench import find_tool
from _prefix_client import measure_prefix
from _server_client import free_port, measure, measure_load, sweep

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"


def random_gpt2(spec: str, directory: Path) -> dict[str, Any]:
    """Writes a GPT-2 with random weights (kael's GPT-2 initialisation, seed 0) to ``directory``."""
    import kael

    if spec == "small":
        layers, heads, dimension, context = 12, 12, 768, 1024
    else:
        parts = [int(p) for p in spec.split(",")]
        layers, heads, dimension = parts[:3]
        context = parts[3] if len(parts) > 3 else 1024
    model = kael.GPT(50257, context, layers, heads, dimension, generator=kael.Generator().manual_seed(0))
    model.save_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    return {"layers": layers, "heads": heads, "dimension": dimension, "context": context, "parameters": params}


@contextlib.contextmanager
def started_server(data: Path, device: str, extra: list[str] | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        if data.is_file():  # a GGUF file holds the model and its tokenizer
            checkpoint = data
        else:
            checkpoint = Path(tmp) / data.name
            checkpoint.mkdir()
            for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
                source = data / name if (data / name).is_file() else TOKENIZER / name
                shutil.copyfile(source, checkpoint / name)
        port = free_port()
        command = [shutil.which("kael-server") or sys.executable]
        if command[0] == sys.executable:
            command += ["-m", "kael_server.cli"]
        command += ["--data", str(checkpoint), "--device", device, "--port", str(port), "--log-level", "warning"]
        command += extra or []
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("kael-server did not start")
                time.sleep(0.1)
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()


LLAMA_SERVER = Path(find_tool("llama-server") or ROOT / "build" / "llama.cpp" / "bin" / "llama-server")
"""llama.cpp's server binary: scripts/build_llama_cpp.sh's cache (tests/llama_cpp_tools.py's lookup)."""


def write_gguf(checkpoint: Path, out: Path, weights: str | None) -> Path:
    """The checkpoint (a GPT-2 directory) as one GGUF file written by kael, in ``weights``' format."""
    import kael
    from kael.models import from_pretrained, save_gguf

    model = from_pretrained(checkpoint)
    tokenizer = kael.BpeTokenizer.from_files(TOKENIZER / "vocab.json", TOKENIZER / "merges.txt")
    save_gguf(model, out, tokenizer, weights=weights or "f32")
    return out


@contextlib.contextmanager
def started_llama_server(
    binary: Path, gguf: Path, slots: int, context: int, extra: tuple[str, ...] = ()
) -> Iterator[str]:
    """llama.cpp's server on gguf with ``slots`` parallel sequences of ``context`` tokens each, on loopback
    (``extra``: more of its flags)."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-np", str(slots), "-c", str(slots * context), "-b", "512", *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:  # 503 while loading
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {' '.join(command)}")
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()


def gguf_context(gguf: Path) -> int:
    """The model's context length from a GGUF file's metadata (``{arch}.context_length``)."""
    import kael

    with kael.io.read_gguf(gguf) as f:
        arch = f.metadata["general.architecture"]
        return int(f.metadata[f"{arch}.context_length"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running kael-server")
    where.add_argument("--data", type=Path, help="checkpoint directory: start kael-server on it")
    where.add_argument(
        "--random-gpt2",
        metavar="SPEC",
        help="build a GPT-2 with random weights with kael (small, or LAYERS,HEADS,DIM[,CONTEXT]) and serve it",
    )
    parser.add_argument("--load", action="store_true", help="K concurrent streaming clients (see --clients)")
    parser.add_argument(
        "--prefix",
        type=int,
        default=None,
        metavar="N",
        help="time to first token of an N-token prefix sent twice (a miss, then a prefix-cache hit), "
        "against a kael-server started with no flags (its defaults)",
    )
    parser.add_argument("--clients", default="1,2,4,8", help="with --load: the values of K, comma-separated")
    parser.add_argument("--slots", type=int, default=8, help="with --load and a started server: its --slots")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="with --load: tokens of each prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="with --load: tokens generated per stream")
    parser.add_argument("--rounds", type=int, default=2, help="with --load: streams per client, one after another")
    parser.add_argument(
        "--passes", type=int, default=3, help="with --load: sweeps over every K; each K reports its median pass"
    )
    parser.add_argument("--device", default="cpu", help="with --data: the device to serve on")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each /health measurement")
    parser.add_argument("--streams", type=int, default=5, help="streams timed for TTFT and tokens/s")
    parser.add_argument("--prompt", default="The meaning of life is")
    parser.add_argument(
        "--weights",
        choices=("f32", "bf16", "f16", "q8_0", "q4_0"),
        default=None,
        help="passed to the kael-server this script starts (kael-server --weights S)",
    )
    parser.add_argument(
        "--llama-server",
        nargs="?",
        type=Path,
        const=LLAMA_SERVER,
        default=None,
        metavar="PATH",
        help=f"with --load: also sweep llama.cpp's server on the same GGUF file (default PATH: {LLAMA_SERVER})",
    )
    args = parser.parse_args()
    if args.llama_server is not None:
        if not args.load or args.url:
            parser.error("--llama-server goes with --load and --data or --random-gpt2")
        if not args.llama_server.is_file():
            parser.error(f"--llama-server: {args.llama_server} does not exist (build it: scripts/build_llama_cpp.sh)")
        if args.data is not None and args.data.suffix.lower() != ".gguf":
            parser.error("--llama-server with --data needs a .gguf file (llama.cpp reads GGUF only)")
    if args.prefix is not None and (args.load or args.llama_server is not None or args.prefix < 1):
        parser.error("--prefix N (N >= 1) measures kael-server alone: not with --load or --llama-server")
    clients = [int(k) for k in args.clients.split(",")]

    def run(url: str) -> dict[str, Any]:
        if args.prefix is not None:
            return measure_prefix(url, args.prefix, 16, args.streams)
        if args.load:
            return measure_load(url, clients, args.prompt_tokens, args.max_tokens, args.rounds, args.passes)
        return measure(url, args.seconds, args.streams, args.prompt)

    batching = ["--slots", str(args.slots), "--queue", str(max(clients))] if args.load else []
    extra = batching + (["--weights", args.weights] if args.weights is not None else [])

    def side_by_side(gguf: Path, result: dict[str, Any]) -> dict[str, Any]:
        """The same sweep against llama-server on gguf (when asked for), added to kael's result."""
        if args.llama_server is None:
            return result
        with started_llama_server(args.llama_server, gguf, args.slots, gguf_context(gguf)) as url:
            theirs = sweep(url, clients, result["prompt"], result["max_tokens"], args.rounds, args.passes)
        result["llama_server"] = {"binary": str(args.llama_server), "gguf": str(gguf), "slots": args.slots, **theirs}
        ratios = {}
        for ours, other in zip(result["load"], theirs["load"]):
            if other["aggregate_tokens_per_s"]:
                ratios[str(ours["clients"])] = round(
                    ours["aggregate_tokens_per_s"] / other["aggregate_tokens_per_s"], 3
                )
        result["aggregate_kael_over_llama_server"] = ratios
        return result

    used = extra  # the flags the started kael-server got
    if args.url:
        result = run(args.url)
    elif args.data:
        with started_server(args.data, args.device, extra) as url:
            result = run(url)
        if args.llama_server is not None:
            result = side_by_side(args.data, result)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / "random-gpt2"
            started = time.perf_counter()
            config = random_gpt2(args.random_gpt2, built)
            config["build_s"] = round(time.perf_counter() - started, 1)
            if args.llama_server is not None:  # both servers on one GGUF file in --weights' format
                data = write_gguf(built, Path(tmp) / "random-gpt2.gguf", args.weights)
                used = batching  # the file already holds the weights in that format
            else:
                data = built
            with started_server(data, args.device, used) as url:
                result = {"random_gpt2": config, **run(url)}
            result = side_by_side(data, result)
    if args.load and not args.url:
        result["server_flags"] = used
    if not args.url:
        result["backend"] = backend_name()
    print(json.dumps(result, indent=2))


def backend_name() -> str | None:
    """The backend serving device cpu in this environment (what a started server uses too)."""
    try:
        import kael

        return str(kael.backends.current("cpu").name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
