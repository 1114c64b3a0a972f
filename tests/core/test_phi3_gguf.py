"""Phi-3 GGUF files (kael/models/_gguf_phi3.py, architecture ``phi3``): llama.cpp's converter output of a random
transformers Phi-3 checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through tests/llama_cpp_tools.py;
skipped without it) loads as a ``Phi3ForCausalLM`` with its fused ``attn_qkv`` / ``ffn_up`` tensors, longrope's
``rope_factors_long`` / ``rope_factors_short`` tensors and attention factor, the rotary dims of a partial rotary
factor, the checkpoint's SentencePiece vocabulary and transformers' logits; ``llama-quantize``'s Q8_0 of that
file loads with the logits kael's own Q8_0 gives; kael's ``save_gguf`` writes a ``phi3`` file that reads back the
same; and llama.cpp (the ``llama_cpp`` package) runs both files with kael's tokens and logits.

The checkpoint's tokenizer is Phi-3's kind (hf_fixtures.write_phi3): a SentencePiece ``tokenizer.model``, which is
what the converter's Phi-3 class reads (it takes a BPE ``tokenizer.json`` only when tokenizer_config.json names
``GPT2Tokenizer``, as Phi-4-mini's does), with ``<|endoftext|>`` and ``<|end|>`` added and an embedding table
padded past the tokens (as Phi-3's 32064 rows for 32011 tokens). The converter writes it as the ``llama``
(SentencePiece) vocabulary real Phi-3 files carry. A Llama-3-style BPE tokenizer in ``bpe/`` is what kael's
``save_gguf`` writes (it writes byte-level BPE vocabularies only).

Why llama.cpp could not load the phi3 files of the earlier tests (a Llama-3-style BPE vocabulary, folder
``phi3-...``): the converter names a file after its folder (``general.name`` "Phi3 ..."), and llama.cpp's
vocabulary loader, for a name containing ``phi3`` or ``phi-3``, sets Phi-3's rstrip flags on ``</s>``, ``<unk>``,
``<s>`` and ``<|endoftext|>`` by ``unordered_map::at``: a vocabulary without them is "error loading model
vocabulary: unordered_map::at". The same file from a folder named otherwise loads. kael now reads those flags as
llama.cpp sets them (NOTE [phi-3 rstrip] in kael/tokenizer/_gguf.py) and names its own phi3 files "Phi 3" (NOTE
[phi3 file name] in _gguf_phi3.py).

Shapes: GQA untied, default rope, a sliding window of 16 (shorter than the 58-token prompt); tied, Phi-4-mini's
partial rotary (0.75) with longrope whose ``original_max_position_embeddings`` (8) is shorter than every prompt,
so each pass (and transformers' generate) uses the long factors; multi-query with full-rotary longrope of original
length 256 (context 1024, attention factor sqrt(1 + ln 4 / ln 256)), so every prompt here uses the short factors.

llama.cpp against kael, on the same file (F32 weights and KV cache): llama.cpp picks longrope's list by the
context size (``n_ctx`` 128, rounded up to 256: the long list when above the original length), kael (as
transformers) by the positions of the pass; both give the long list with original length 8 and the short one
with 256, and llama.cpp in a context of 512 gives kael's long-list logits. llama.cpp's phi3 graph ignores the
sliding window (it logs "Phi SWA is currently disabled"): it gives the logits of kael's model without the window,
and differs from kael's windowed ones (which are transformers') by far more than the noise. The noise, measured at
seed 4 over the three shapes and both files (58 and 65 teacher-forced tokens): max |diff| 7e-6 to 5e-5 for logits
of max |logit| 6 to 8 (float32 sums in another order); the bound, 5e-4, leaves a factor of 10; top-1 agreement
was 1.0 everywhere, asserted >= 0.99. What is not noise, measured: llama.cpp's full attention against kael's
16-wide window, and the long list against the short one, both about 10.

Oracles: transformers' Phi3ForCausalLM on the checkpoint, kael's ``from_pretrained`` of it (F32 and
``weights="q8_0"``), sentencepiece and the checkpoint's tokenizer.json (the ``tokenizers`` library) for the
vocabulary, and llama.cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import llama_cpp_tools
import numpy as np
import pytest
from gguf_models_common import TEXT, logits_of, rewrite
from hf_fixtures import CORPUS, write_llama3, write_phi3
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models.phi3 import Phi3ForCausalLM
from kael.tokenizer import load_tokenizer
from phi3_checkpoints import build, longrope

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied-window16": {"tie_word_embeddings": False, "sliding_window": 16},
    "tied-partial-longrope8": {
        "tie_word_embeddings": True,
        "original_max_position_embeddings": 8,
        "rope_parameters": {**longrope(12, seed=6), "partial_rotary_factor": 0.75},
    },
    "mqa-longrope256": {
        "tie_word_embeddings": False,
        "num_key_value_heads": 1,
        "max_position_embeddings": 1024,
        "original_max_position_embeddings": 256,
        "rope_parameters": longrope(16, seed=5),
    },
}
# Q8_0 against transformers' float32 logits (test_qwen3_gguf's reasoning), relative to the largest |logit|:
# measured at seed 4 0.06 to 0.13 (the tied shape: its Q8_0 table is the head too) with top-1 agreement 0.90 to
# 0.93; the bounds leave margin. The exact check is against kael's own Q8_0 of the checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.2, 0.85)
# llama.cpp against kael on one F32 file: the module docstring's measured noise, and top-1 agreement
LLAMA_CPP_TOLERANCE, LLAMA_CPP_TOP1 = 5e-4, 0.99
_ORIGINAL = "phi3.rope.scaling.original_context_length"
_WINDOW = "phi3.attention.sliding_window"


@pytest.fixture(scope="module", params=list(SHAPES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> fg.Checkpoint:
    """(directory, transformers model): a random phi3 checkpoint with a Phi-3-style SentencePiece tokenizer, its
    table padded to a multiple of 32 rows past the tokens of both it and ``bpe/``, a Llama-3-style tokenizer."""
    d = tmp_path_factory.mktemp(f"phi3-{request.param}")
    write_phi3(d)
    sizes = (load_tokenizer(d).vocab_size, load_tokenizer(write_llama3(d / "bpe")).vocab_size)
    return d, build(d, seed=4, vocab_size=-(-max(sizes) // 32) * 32, **SHAPES[request.param])


def _file(f: Any, hf: Any) -> None:
    cfg, md = hf.config, f.metadata
    rot = int(cfg.hidden_size // cfg.num_attention_heads * cfg.rope_parameters["partial_rotary_factor"])
    assert md["phi3.rope.dimension_count"] == rot
    assert md[_WINDOW] == (cfg.sliding_window or 0)
    assert "blk.0.attn_qkv.weight" in f.tensors and "blk.0.attn_q.weight" not in f.tensors
    assert ("rope_factors_long.weight" in f.tensors) == (cfg.rope_parameters["rope_type"] == "longrope")


def _converted(f: Any, hf: Any) -> None:
    """The converter's file: the longrope metadata, and Phi-3's SentencePiece vocabulary padded as Phi-3's is."""
    _file(f, hf)
    md, n = f.metadata, hf.config.vocab_size
    assert md[_ORIGINAL] == hf.config.original_max_position_embeddings
    assert md["tokenizer.ggml.model"] == "llama" and len(md["tokenizer.ggml.tokens"]) == n
    k = md["tokenizer.ggml.tokens"].index("<|endoftext|>")  # after the SentencePiece pieces
    assert (
        md["tokenizer.ggml.tokens"][:3] == ["<unk>", "<s>", "</s>"] and md["tokenizer.ggml.tokens"][k + 1] == "<|end|>"
    )
    assert md["tokenizer.ggml.tokens"][k + 2 :] == [f"[PAD{i}]" for i in range(k + 2, n)]  # UNUSED rows
    assert set(md["tokenizer.ggml.token_type"][k + 2 :]) == {5}


def _model(model: Any, hf: Any) -> None:
    rp, cfg = hf.config.rope_parameters, model.config
    assert cfg.rotary_dim == int(cfg.dim * rp["partial_rotary_factor"])
    assert cfg.sliding_window == hf.config.sliding_window
    if rp["rope_type"] == "longrope":
        assert cfg.longrope is not None
        assert cfg.longrope.original_max_position_embeddings == hf.config.original_max_position_embeddings
        assert list(cfg.longrope.long_factor) == pytest.approx(rp["long_factor"])
        assert list(cfg.longrope.short_factor) == pytest.approx(rp["short_factor"])
        # the converter's attention factor: sqrt(1 + ln(context / original) / ln(original)), as transformers'
        assert cfg.attention_scale == pytest.approx(hf.model.rotary_emb.attention_scaling, rel=1e-6)
    else:
        assert cfg.longrope is None


def _llama_cpp(path: Path, ids: list[int], n_ctx: int = 128) -> tuple[Any, np.ndarray]:
    """llama.cpp's model of the file and its logits of one teacher-forced pass over ``ids`` (F32 KV cache)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=llama_cpp_tools.SKIP_REASON + ": no llama_cpp package")
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, verbose=False, type_k=0, type_v=0)
    llm.eval(ids)
    return llm, np.asarray(llm.scores[: len(ids)], dtype=np.float32)


def _agree(theirs: np.ndarray, ours: np.ndarray) -> None:
    """llama.cpp's logits within the measured noise of kael's, and the same top-1 token (module docstring)."""
    diff = float(np.abs(theirs - ours).max())
    top1 = float((theirs.argmax(-1) == ours.argmax(-1)).mean())
    assert diff < LLAMA_CPP_TOLERANCE and top1 >= LLAMA_CPP_TOP1, (diff, top1)


def _unwindowed(path: Path, tmp_path: Path) -> Any:
    """kael's model of the file with its sliding window removed (what llama.cpp's phi3 graph runs)."""
    return load_gguf(rewrite(path, tmp_path / "no-window.gguf", meta={_WINDOW: 0}))[0]


def test_the_checkpoint_tokenizer_is_sentencepieces(checkpoint: fg.Checkpoint) -> None:
    """Its ids are sentencepiece's (each stretch between special tokens prefixed with ``▁``, as llama.cpp's)."""
    d, _ = checkpoint
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    tok = load_tokenizer(d)
    eot = [sp.vocab_size()]  # <|endoftext|>, the first token after the pieces
    for text in [*CORPUS, TEXT * 2, " leading space", "x  two  spaces"]:
        want = [1]
        for i, part in enumerate(text.split("<|endoftext|>")):
            want += (eot if i else []) + sp.encode(part)
        assert tok.encode(text) == want, text


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "phi3", Phi3ForCausalLM, _converted, _model)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, Phi3ForCausalLM, Q8_0_TOLERANCE, relative=True)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    def saved(f: Any, model: Any, hf: Any) -> None:
        _file(f, hf)
        assert f.metadata["general.name"] == "Phi 3"  # NOTE [phi3 file name]

    d, _ = checkpoint
    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "phi3", Phi3ForCausalLM, saved, tokenizer_dir=d / "bpe")


def test_llama_cpp_runs_the_converters_file(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """Same tokens (SentencePiece; the rstrip flags llama.cpp gives a file named Phi-3) and logits."""
    d, hf = checkpoint
    path = fg.convert(d, d / "converted-f32.gguf")
    ids = fg.text_ids(d)
    llm, theirs = _llama_cpp(path, ids)
    model, tok = load_gguf(path)
    with kael.io.read_gguf(path) as f:
        assert "phi3" in f.metadata["general.name"].lower()  # the folder's name: NOTE [phi-3 rstrip]
    assert llm.tokenize((TEXT * 2).encode(), add_bos=True, special=True) == tok.encode(TEXT * 2) == ids
    text = "<|end|>\n <|end|>x<|endoftext|>  y</s> z"
    assert llm.tokenize(text.encode(), add_bos=True, special=True) == tok.encode(text) == load_tokenizer(d).encode(text)
    _agree(theirs, logits_of(_unwindowed(path, tmp_path) if hf.config.sliding_window else model, ids))


def test_llama_cpp_runs_kaels_file(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """kael's F32 file (a BPE vocabulary, named "Phi 3"): llama.cpp loads it with kael's tokens and logits."""
    d, hf = checkpoint
    model = from_pretrained(d)
    path = tmp_path / "kael-phi3.gguf"
    save_gguf(model, path, load_tokenizer(d / "bpe"))
    ids = fg.text_ids(d / "bpe")
    llm, theirs = _llama_cpp(path, ids)
    assert llm.tokenize((TEXT * 2).encode(), add_bos=True, special=True) == ids
    _agree(theirs, logits_of(_unwindowed(path, tmp_path) if hf.config.sliding_window else model, ids))


def test_llama_cpp_ignores_the_sliding_window(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """llama.cpp's phi3 attends to the whole context: kael's windowed logits (transformers') differ from its."""
    d, hf = checkpoint
    if hf.config.sliding_window is None:
        pytest.skip("no sliding window")
    path = fg.convert(d, d / "converted-f32.gguf")
    ids = fg.text_ids(d)
    assert len(ids) > 2 * hf.config.sliding_window
    _, theirs = _llama_cpp(path, ids)
    windowed = logits_of(load_gguf(path)[0], ids)
    w = hf.config.sliding_window
    _agree(theirs[:w], windowed[:w])  # inside the window: the same
    assert float(np.abs(theirs[w:] - windowed[w:]).max()) > 100 * LLAMA_CPP_TOLERANCE


def test_llama_cpp_picks_the_long_factors_by_context_size(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    """In a context longer than the original length llama.cpp rotates every position with the long factors,
    from the first: kael's logits with the long list (the original length set below the prompt's, the attention
    factor kept), not kael's (transformers') short-list ones."""
    d, hf = checkpoint
    original = hf.config.original_max_position_embeddings
    if hf.config.rope_parameters["rope_type"] != "longrope" or original < 256:
        pytest.skip("the short factors need an original length of at least llama.cpp's smallest context, 256")
    path = fg.convert(d, d / "converted-f32.gguf")
    ids = fg.text_ids(d)
    _, theirs = _llama_cpp(path, ids, n_ctx=2 * original)
    long = load_gguf(rewrite(path, tmp_path / "long.gguf", meta={_ORIGINAL: 8}))[0]
    _agree(theirs, logits_of(long, ids))
    assert float(np.abs(theirs - logits_of(load_gguf(path)[0], ids)).max()) > 100 * LLAMA_CPP_TOLERANCE


def test_a_file_with_one_factor_list_is_refused(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, hf = checkpoint
    if hf.config.rope_parameters["rope_type"] != "longrope":
        pytest.skip("no longrope tensors")
    src = fg.convert(d, d / "converted-f32.gguf")
    out = rewrite(src, tmp_path / "one-list.gguf", drop=("rope_factors_short.weight",))
    with pytest.raises(kael.FormatError, match="rope_factors_short"):
        load_gguf(out)


def test_a_short_sliding_window_is_every_layers_window(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    d, _ = checkpoint
    src = fg.convert(d, d / "converted-f32.gguf")
    out = rewrite(src, tmp_path / "window.gguf", meta={_WINDOW: 12})
    model = load_gguf(out)[0]
    assert model.config.sliding_window == 12 and set(model.config.layer_windows) == {12}
    assert all(blk.self_attn.window == 12 for blk in model.model.layers)


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """As fg.check_llama_cpp_agrees_on_q8_0, on prompts no longer than the sliding window where there is one
    (llama.cpp's phi3 ignores the window: test_llama_cpp_ignores_the_sliding_window)."""
    window = checkpoint[1].config.sliding_window
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch, length=min(96, window or 96))
