"""Structured outputs (issue 30): constraints on what a sequence may generate.

``json_schema``, ``json_object``, ``regex``, ``choice`` and ``grammar`` build a ``Constraint``;
``ConstraintMatcher(constraint, tokenizer, eos)`` compiles it against a kael tokenizer (cached
by grammar text and tokenizer) and is a ``kael.engine.LogitsProcessor``: ``apply`` masks a
row's logits to -inf outside the grammar, ``accept`` / ``fork`` / ``rollback`` keep it in step;
``fill_bitmasks`` computes many rows' masks at once. ``model.generate(..., constraint=c,
tokenizer=tok)`` and ``kael.engine.SamplingParams(constraint=c)`` (a ``TokenSampler``, so
``BatchDecoder`` rows and kael-server) sample under one; ``constrained_sampler`` is a bare
greedy one. Errors are ``ConstraintError`` naming the request field. Needs the ``constraints`` extra (``pip install kael-core[constraints]``).

The library was chosen by measurement (``benchmarks/structured.py``; GPT-2's 50257 tokens,
this machine, 2 shared cores, ten JSON schemas of 1-46 properties, a 200-token walk each):

==============  ==========  =====================  ============  =========  =====================
library         tok. setup  compile                mask / token  RSS grows  fork / rollback
==============  ==========  =====================  ============  =========  =====================
llguidance      0.26 s      19 ms (all 10)         180 us        +15 MB     deep_copy; rollback(n)
xgrammar        0.14 s      400 ms (all 10)        278 us        +231 MB    none; rollback(n)
outlines-core   0.08 s      1263 ms (first 4 only)  1620 us       +50 MB     copy; no rollback
==============  ==========  =====================  ============  =========  =====================

(xgrammar's memory includes the torch it imports; outlines-core builds the whole token DFA at
compile, so only four schemas were timed.) Features: all three take JSON schema and regex
(choice as an alternation); llguidance also Lark and GBNF (converted) grammars and fast-forward
tokens; xgrammar EBNF and structural tags, jump-forward strings; outlines-core regex / JSON
schema only.

llguidance: compiles lazily (a schema is usable in about 2 ms, no per-schema vocabulary pass),
has the fastest mask here and the smallest footprint, and is the only one with both fork
(``deep_copy``) and rollback plus Lark/GBNF grammars: what ``n > 1`` and speculative decoding
need.
"""

from __future__ import annotations

from ._matcher import ConstraintMatcher, allowed_ids, fill_bitmasks, mask_logits, new_bitmask
from ._sampler import constrained_sampler, stop_at_end
from ._spec import Constraint, ConstraintError, Limits, choice, grammar, json_object, json_schema, regex

__all__ = [
    "Constraint",
    "ConstraintError",
    "ConstraintMatcher",
    "Limits",
    "allowed_ids",
    "choice",
    "constrained_sampler",
    "fill_bitmasks",
    "grammar",
    "json_object",
    "json_schema",
    "mask_logits",
    "new_bitmask",
    "regex",
    "stop_at_end",
]
