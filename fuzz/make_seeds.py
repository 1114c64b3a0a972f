"""Write the seed corpora: `python fuzz/make_seeds.py` (re)creates fuzz/corpus/<target>/.

Seeds are small valid inputs that reach the deep checks at once; the fuzzer mutates
them into the invalid ones. The files are committed; this script is how they were made.
It builds every file by hand (struct, json), not with kael's writers, so a bug in a
writer cannot hide the same bug in its reader.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
sys.path.insert(0, str(HERE))

Seeds = dict[str, bytes]


def _safetensors_file(header: Mapping[str, object], data: bytes, *, pad: bool = True) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)  # the data section starts 8-aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw + data


def safetensors_seeds() -> Seeds:
    # F32 [2] at 0 (aligned), BOOL [1] at 8, I64 [1, 1] at 9: packed tightly, so the
    # mapped loader meets an aligned tensor (a view) and a misaligned one (a copy).
    main = _safetensors_file(
        {
            "__metadata__": {"format": "pt", "note": "kael fuzz seed"},
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "flag": {"dtype": "BOOL", "shape": [1], "data_offsets": [8, 9]},
            "step": {"dtype": "I64", "shape": [1, 1], "data_offsets": [9, 17]},
        },
        struct.pack("<2f", 1.5, -2.0) + b"\x01" + struct.pack("<q", -7),
    )
    every_dtype = {}
    data = b""
    for dtype, size in [("F64", 8), ("BF16", 2), ("F16", 2), ("I32", 4), ("I16", 2), ("I8", 1), ("U8", 1)]:
        every_dtype[dtype.lower()] = {"dtype": dtype, "shape": [2], "data_offsets": [len(data), len(data) + 2 * size]}
        data += bytes(range(1, 2 * size + 1))
    every_dtype["empty"] = {"dtype": "F32", "shape": [0, 3], "data_offsets": [len(data), len(data)]}
    every_dtype["scalar"] = {"dtype": "F32", "shape": [], "data_offsets": [len(data), len(data) + 4]}
    data += struct.pack("<f", 3.0)
    return {
        "f32_bool_i64_metadata.safetensors": main,
        "every_dtype.safetensors": _safetensors_file(every_dtype, data, pad=False),
        "no_tensors.safetensors": _safetensors_file({}, b""),
    }


def _idx(code: int, dims: list[int], payload: bytes) -> bytes:
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


def idx_seeds() -> Seeds:
    return {
        "images_2x2x2_u8.idx": _idx(0x08, [2, 2, 2], bytes([0, 255, 7, 128, 1, 2, 3, 4])),
        "labels_3_u8.idx": _idx(0x08, [3], bytes([0, 9, 4])),
        "f32_2x1.idx": _idx(0x0D, [2, 1], struct.pack(">2f", 0.5, -1.0)),
        "i16_empty.idx": _idx(0x0B, [0, 2], b""),
    }


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte (kept independent of kael's table)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return [table[b] for b in range(256)]


def tokenizer_seeds() -> Seeds:
    """Inputs are `vocab.json NUL merges.txt NUL text` (see fuzz_tokenizer)."""
    chars = _byte_chars()
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o")]
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    vocab_json = json.dumps(vocab, ensure_ascii=False).encode()
    merges_txt = ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)).encode()
    texts = [
        "Hello the world, hello there!",
        "I'm fine\n\n  they'll  say  123 4567<|endoftext|>¿Qué? 日本語 😀 e\u0301",
        "",
    ]
    seeds = {f"tiny_vocab_{i}.bin": vocab_json + b"\0" + merges_txt + b"\0" + t.encode() for i, t in enumerate(texts)}
    seeds["text_only_surrogate.bin"] = b"\0\0" + b"tab\there " + b"\xed\xa0\x80 \xff end"
    return seeds


def _added(token_id: int, content: str) -> dict[str, object]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]], **options: object) -> dict[str, object]:
    model: dict[str, object] = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
    }
    model.update(options)
    model["vocab"] = vocab
    model["merges"] = [[a, b] for a, b in merges]
    return model


def hf_tokenizer_seeds() -> Seeds:
    """Inputs are `tokenizer.json NUL tokenizer_config.json NUL text` (see fuzz_hf_tokenizer)."""
    chars = _byte_chars()
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o")]
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [_added(len(vocab) + i, name) for i, name in enumerate(specials)]
    byte_level = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": _bpe_model({**vocab, **{name: len(vocab) + i for i, name in enumerate(specials)}}, merges),
    }
    chatml = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    chatml_config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": chatml}
    # Llama 2 style: <unk> <s> </s>, the byte tokens, a few merges over Metaspace pieces
    llama_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        llama_vocab[f"<0x{byte:02X}>"] = len(llama_vocab)
    llama_merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l")]
    for a, b in llama_merges:
        llama_vocab.setdefault(a, len(llama_vocab))
        llama_vocab.setdefault(b, len(llama_vocab))
        llama_vocab.setdefault(a + b, len(llama_vocab))
    llama = {
        "version": "1.0",
        "added_tokens": [_added(i, name) for i, name in enumerate(["<unk>", "<s>", "</s>"])],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": _bpe_model(llama_vocab, llama_merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True),
    }
    inst = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}{% if m['role'] == 'user' %}"
        "{{ bos_token + '[INST] ' + m['content'].strip() + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + eos_token }}"
        "{% endif %}{% endfor %}"
    )
    llama_config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": inst}

    def seed(tokenizer: Mapping[str, object], config: Mapping[str, object] | None, text: str) -> bytes:
        config_bytes = json.dumps(config, ensure_ascii=False).encode() if config is not None else b""
        return json.dumps(tokenizer, ensure_ascii=False).encode() + b"\0" + config_bytes + b"\0" + text.encode()

    return {
        "byte_level_chatml.bin": seed(byte_level, chatml_config, "Hello the world<|im_end|> 日本語 😀"),
        "byte_level_no_config.bin": seed(byte_level, None, "  hello  there\n\n"),
        "llama_byte_fallback_inst.bin": seed(llama, llama_config, "the hello ¿Qué? 💩 <s>x</s>"),
        "llama_no_template.bin": seed(llama, {"eos_token": "</s>"}, ""),
    }


def generate_request_seeds() -> Seeds:
    bodies = {
        "generate_min.json": {"prompt": "Hello"},
        "generate_all.json": {
            "prompt": "Once upon a time",
            "max_tokens": 8,
            "temperature": 0.7,
            "top_k": 40,
            "seed": 1,
            "stream": True,
        },
        "completion_all.json": {
            "prompt": "Say hi",
            "model": "gpt2",
            "max_tokens": 4,
            "temperature": 0,
            "top_p": 1,
            "top_k": 0,
            "n": 1,
            "stop": ["\n", "."],
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "echo": False,
            "user": "u",
        },
        "detokenize.json": {"tokens": [15496, 995, 0]},
        "chat_json_schema.json": {
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "pet",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"name": {"type": "string", "maxLength": 8}, "kind": {"enum": ["cat", "dog"]}},
                        "required": ["name", "kind"],
                        "additionalProperties": False,
                    },
                },
            },
        },
        "chat_tools.json": {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "w",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                    },
                }
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        "completion_guided.json": {"prompt": "a", "structured_outputs": {"regex": "[a-c]{2}"}, "max_tokens": 4},
        "completion_grammar.json": {"prompt": "a", "grammar": 'root ::= "yes" | "no"'},
    }
    seeds = {name: json.dumps(body).encode() for name, body in bodies.items()}
    seeds["unicode_escapes.json"] = b'{"prompt": "caf\\u00e9 \\ud83d\\ude00", "stop": "x"}'
    return seeds


def kernels_seeds() -> Seeds:
    """Valid cases of fuzz_kernels' encoding (see kernel_spec.encode_case): one or two per family."""
    from kael import int64
    from kernel_spec import ALL, encode_case, encode_quant

    dense = bytes(3)  # a tensor's layout bytes: dim order 0, steps 1, offset 0
    seed = b"\x05\0\0\0"
    # float16 scales of every class among the raw bytes: 0x7c00 inf, 0xfe00 NaN, 0x0001 subnormal, 0x3c00 one
    raw_bytes = b"\x00\x7c\x00\xfe\x01\x00\x00\x3c" + bytes(range(7, 256, 3))
    return {
        "dequantize_q4_k_quantized.bin": encode_quant("dequantize", "q4_k", 17, 2, quantized=True),
        "dequantize_q8_0_raw.bin": encode_quant(
            "dequantize", "q8_0", 3, 2, raw=True, extra=dense * 2 + seed + raw_bytes
        ),
        "dequantize_iq4_xs_out_strided.bin": encode_quant("dequantize", "iq4_xs", 2, 1, extra=b"\x00\x02\x01"),
        "quantized_linear_q8_0_repacked.bin": encode_quant("quantized_linear", "q8_0", 40, 2, 5, bias=True),
        "quantized_linear_q4_0_rows_alone_no_repack.bin": encode_quant(
            "quantized_linear", "q4_0", 33, 1, 16, quantized=True, repack=(False, False)
        ),
        "quantized_linear_q6_k_prompt.bin": encode_quant("quantized_linear", "q6_k", 17, 1, 20, bias=True),
        "quantized_linear_bf16_3d.bin": encode_quant("quantized_linear", "bf16", 9, 3, 6, form=2, bias=True, tail=5),
        "quantized_linear_q5_1_raw.bin": encode_quant(
            "quantized_linear", "q5_1", 16, 1, 3, raw=True, extra=dense * 3 + seed + raw_bytes
        ),
        "add_f32.bin": encode_case("add", "float32", (3, 4)),
        "add_f32_inplace_bcast.bin": encode_case("add", "float32", (3, 4), inplace=True, extra=dense * 2 + b"\0\x03\0"),
        "exp_f32_transposed.bin": encode_case("exp", "float32", (4, 2), extra=dense + b"\x01\x00\x01"),
        "lt_f64.bin": encode_case("lt", "float64", (5,)),
        "maximum_i32_raw.bin": encode_case("maximum", "int32", (6,), raw=True, extra=dense * 3 + bytes(range(4, 40))),
        "floor_divide_i64_raw.bin": encode_case("floor_divide", "int64", (4,), raw=True, extra=dense * 3 + bytes(40)),
        "copy_i64_to_f16.bin": encode_case("copy", "float16", (2, 3), prefix=bytes([ALL.index(int64)])),
        "where_f32.bin": encode_case("where", "float32", (2, 3)),
        "matmul_f64.bin": encode_case("matmul", "float64", prefix=b"\x00\x02\x03\x02"),
        "matmul_f32_batched.bin": encode_case("matmul", "float32", prefix=b"\x01\x02\x03\x04\x05"),
        "sum_i64_dim1.bin": encode_case("sum", "int64", (3, 4), extra=b"\x02"),
        "argmax_f32.bin": encode_case("argmax", "float32", (3, 5), extra=b"\x01"),
        "cat_i32.bin": encode_case("cat", "int32", (2, 3), extra=b"\x01\x01\x02\x04"),
        "index_select_f32.bin": encode_case("index_select", "float32", (4, 3), extra=b"\x00\x05"),
        "softmax_f32.bin": encode_case("softmax", "float32", (2, 5), extra=dense * 2 + b"\x01"),
        "layer_norm_f32.bin": encode_case("layer_norm", "float32", (2, 8), extra=b"\x03"),
        "silu_bf16_transposed.bin": encode_case("silu", "bfloat16", (4, 3), extra=dense + b"\x01\x00\x01"),
    }


def _gguf_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _gguf_file(kvs: list[bytes], infos: list[bytes], data: bytes, *, version: int = 3, alignment: int = 32) -> bytes:
    """Header, key/value pairs, tensor infos, zero padding to `alignment`, then the data section."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % alignment) + data


def _gguf_kv(key: str, type_id: int, payload: bytes) -> bytes:
    return _gguf_str(key) + struct.pack("<I", type_id) + payload


def _gguf_info(name: str, ne: list[int], type_id: int, offset: int) -> bytes:
    return _gguf_str(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)


def gguf_seeds() -> Seeds:
    # Value type ids: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
    # 10 u64, 11 i64, 12 f64. Tensor type ids: 0 F32, 1 F16, 2 Q4_0, 8 Q8_0, 24-27 I8-I64, 28 F64, 30 BF16.
    every_value = [
        _gguf_kv("general.architecture", 8, _gguf_str("llama")),
        _gguf_kv("v.u8", 0, b"\xff"),
        _gguf_kv("v.i8", 1, b"\x80"),
        _gguf_kv("v.u16", 2, struct.pack("<H", 65535)),
        _gguf_kv("v.i16", 3, struct.pack("<h", -2)),
        _gguf_kv("v.u32", 4, struct.pack("<I", 7)),
        _gguf_kv("v.i32", 5, struct.pack("<i", -7)),
        _gguf_kv("v.f32", 6, struct.pack("<f", 0.5)),
        _gguf_kv("v.bool", 7, b"\x01"),
        _gguf_kv("v.u64", 10, struct.pack("<Q", 2**64 - 1)),
        _gguf_kv("v.i64", 11, struct.pack("<q", -(2**63))),
        _gguf_kv("v.f64", 12, struct.pack("<d", -0.0)),
        _gguf_kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + b"".join(_gguf_str(t) for t in ("a", "", "é"))),
        _gguf_kv("tokenizer.ggml.scores", 9, struct.pack("<IQ3f", 6, 3, 0.0, -1.0, 2.5)),
        _gguf_kv("v.bools", 9, struct.pack("<IQ", 7, 2) + b"\x00\x01"),
        _gguf_kv("v.nested", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQi", 5, 1, 3) + struct.pack("<IQ", 5, 0)),
    ]
    f32 = struct.pack("<8f", *range(8))  # F32 [2, 4]
    q8 = struct.pack("<e", 0.5) + bytes(range(32))  # one Q8_0 block: [1, 32]
    value_file = _gguf_file(every_value, [_gguf_info("w", [4, 2], 0, 0), _gguf_info("q", [32, 1], 8, 32)], f32 + q8)
    q4 = (struct.pack("<e", 1.0) + bytes(range(16))) * 2  # two Q4_0 blocks: [2, 32]
    bf16 = struct.pack("<32H", *range(0x3F80, 0x3F80 + 32))  # BF16 [32]
    f16 = struct.pack("<3e", 1.0, -2.0, 0.25)  # F16 [3]
    ints = struct.pack("<2b", -1, 1) + bytes(62) + struct.pack("<2q", 5, -5)  # I8 [2] at 0, I64 [2, 1] at 64
    blocks = _gguf_file(
        [_gguf_kv("general.alignment", 4, struct.pack("<I", 64))],
        [
            _gguf_info("blk.0.attn_q.weight", [32, 2], 2, 0),
            _gguf_info("bf", [32], 30, 64),
            _gguf_info("h", [3], 1, 128),
            _gguf_info("i8", [2], 24, 192),
            _gguf_info("i64", [1, 2], 27, 256),
        ],
        q4 + bytes(28) + bf16 + f16 + bytes(58) + ints,
        alignment=64,
    )
    v2 = _gguf_file(
        [_gguf_kv("general.name", 8, _gguf_str("v2"))], [_gguf_info("s", [], 28, 0)], struct.pack("<d", 1.5), version=2
    )
    per_type = {}  # one seed per block format of kael's registry: two rows of two blocks each
    from kael.quant.formats import FORMATS

    for fmt in FORMATS.values():
        if not fmt.blocked:
            continue
        block = (struct.pack("<e", 0.5) * (fmt.block_bytes // 2 + 1))[: fmt.block_bytes]  # float16 0.5 in every slot
        data = bytes(b ^ (i % 251) for i, b in enumerate(block * 4))  # vary the bits, keep the layout
        per_type[f"type_{fmt.name}_2x2_blocks.gguf"] = _gguf_file(
            [_gguf_kv("general.name", 8, _gguf_str(fmt.name))],
            [_gguf_info(f"{fmt.name}.weight", [2 * fmt.block_values, 2], fmt.ggml_type, 0)],
            data,
        )
    return {
        **per_type,
        "every_value_type_f32_q8_0.gguf": value_file,
        "alignment_64_q4_0_bf16_f16_ints.gguf": blocks,
        "version_2_scalar_f64.gguf": v2,
        "metadata_only.gguf": _gguf_file(every_value[:3], [], b""),
    }


MAKERS: dict[str, Callable[[], Seeds]] = {
    "fuzz_safetensors": safetensors_seeds,
    "fuzz_gguf": gguf_seeds,
    "fuzz_idx": idx_seeds,
    "fuzz_tokenizer": tokenizer_seeds,
    "fuzz_hf_tokenizer": hf_tokenizer_seeds,
    "fuzz_generate_request": generate_request_seeds,
    "fuzz_kernels": kernels_seeds,
}


def main() -> None:
    for target, make in MAKERS.items():
        folder = CORPUS / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, data in make().items():
            (folder / name).write_bytes(data)
        print(f"{folder.relative_to(HERE.parent)}: {len(list(folder.iterdir()))} seeds")


if __name__ == "__main__":
    main()
