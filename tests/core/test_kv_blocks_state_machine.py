"""BlockPool (kael/models/_kv_blocks.py): random operation sequences against a simulated KV store.

A hypothesis state machine runs random allocate/append/decode-step/fork/free/reset sequences,
and sliding-window releases of a sequence's leading blocks, over a small pool. Oracle: a simulated KV store in which every block slot holds the token
prefix its K/V would be computed from, written exactly where the pool's answers tell a caller
to write and copy; a position whose slot does not hold its own sequence's prefix means the pool
shared, reused or copied a block wrongly. The machine also keeps its own copy of every block
table (from the returned values only) and counts references itself. It runs with the default
digest, with a digest that always collides, with one of only three keys, and with prefix
caching off, and reusing whole blocks only (no partial block).
"""

from __future__ import annotations

import hashlib
from typing import Any

from block_pool_state import snapshot
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kael.models._kv_blocks import RELEASED, Allocation, BlockPool, default_digest

# --- random operation sequences against a simulated KV store ----------------------------------

# Prompts are a prefix of one of a few stems (which share prefixes of their own) plus a random
# tail from a small alphabet, so block-aligned prefixes repeat often.
STEMS = ([0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 0, 2, 2, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1])
PROMPTS = st.builds(
    lambda stem, k, tail: (stem[:k] + tail) or [0],
    st.sampled_from(STEMS),
    st.integers(0, 8),
    st.lists(st.sampled_from([0, 1, 2]), max_size=4),
)


class PoolMachine(RuleBasedStateMachine):
    """Random allocate/append/fork/free/reset over a small pool, checked against a simulated KV store."""

    digest: Any = staticmethod(default_digest)
    exact_digest = True  # different contents never collide: every live full block is findable
    prefix_caching = True
    partial_blocks = True

    @initialize(num_blocks=st.integers(3, 12), block_size=st.integers(1, 4))
    def start(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(
            num_blocks,
            block_size,
            prefix_caching=self.prefix_caching,
            partial_blocks=self.partial_blocks,
            _digest=self.digest,
        )
        self.bs = block_size
        self.tokens: dict[int, list[int]] = {}  # each live sequence's tokens
        self.tables: dict[int, list[int]] = {}  # its block table, from the pool's answers only
        self.kv: dict[int, dict[int, tuple[int, ...]]] = {}  # block -> slot -> the prefix its K/V encodes
        self.next_id = 0
        self.hits = 0

    def write(self, block: int, slot: int, prefix: tuple[int, ...]) -> None:
        self.kv.setdefault(block, {})[slot] = prefix

    def others_hold(self, block: int, sid: int) -> bool:
        return any(block in t for s, t in self.tables.items() if s != sid)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), tail=st.lists(st.sampled_from([0, 1, 2]), max_size=3))
    def allocate_like(self, data: st.DataObject, tail: list[int]) -> None:
        """A prompt that starts like a live sequence (a twin of its blocks when it is all of them)."""
        toks = self.tokens[data.draw(st.sampled_from(sorted(self.tokens)))]
        self.allocate(toks[: data.draw(st.integers(1, len(toks)))] + tail)

    @rule(prompt=PROMPTS)
    def allocate(self, prompt: list[int]) -> None:
        pool, bs, n = self.pool, self.bs, len(prompt)
        sid, self.next_id = self.next_id, self.next_id + 1
        # What any live sequence's full blocks share with the prompt must be found (exact digest).
        # Token by token into one more full block of it (NOTE [partial block]), never the last token.
        common = 0
        for s, toks in self.tokens.items():
            if RELEASED in self.tables[s]:  # a lookup reuses only a prefix that is all present
                continue
            k, full = 0, len(toks) // bs * bs
            while k < min(full, n - 1) and toks[k] == prompt[k]:
                k += 1
            common = max(common, k if self.partial_blocks else k // bs * bs)
        before = snapshot(pool)
        free_before = pool.free_blocks
        got = pool.allocate(sid, prompt)
        if got is None:
            event("allocate: None")
            assert snapshot(pool) == before
            assert -(-n // bs) > free_before  # it would have fitted in the free and cached blocks
            if self.prefix_caching and self.exact_digest:  # it would have fitted, reusing what live blocks hold
                assert -(-n // bs) - common // bs > free_before
            return
        c, table = got.cached_tokens, list(got.block_table)
        assert 0 <= c <= n - 1 and len(table) == -(-n // bs) == len(set(table))
        if not self.prefix_caching:
            assert c == 0
        elif self.exact_digest:
            assert c >= common
        if not self.partial_blocks:
            assert c % bs == 0
        if c % bs:  # the caller copies the partial block's slots first (NOTE [partial block])
            src, dst, start = got.copied_from, table[c // bs], c - c % bs
            assert src is not None and src not in table and not self.others_hold(dst, sid)
            for j in range(c % bs):
                assert self.kv[src][j] == tuple(prompt[: start + j + 1])
                self.write(dst, j, self.kv[src][j])
            event("allocate: partial block")
        else:
            assert got.copied_from is None
        for p in range(c):  # the reused K/V is this prompt's own
            assert self.kv[table[p // bs]][p % bs] == tuple(prompt[: p + 1])
        for b in table[c // bs :]:  # what the caller writes is nobody else's
            assert not self.others_hold(b, sid)
        for p in range(c, n):
            self.write(table[p // bs], p % bs, tuple(prompt[: p + 1]))
        self.tokens[sid], self.tables[sid] = list(prompt), table
        self.hits += c
        assert pool.hit_tokens == self.hits
        event(f"allocate: {'hit' if c else 'miss'}")

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), token=st.sampled_from([0, 1, 2]))
    def append(self, data: st.DataObject, token: int) -> None:
        self.append_to(data.draw(st.sampled_from(sorted(self.tokens))), token)

    def append_to(self, sid: int, token: int) -> bool | None:
        """Append ``token`` to ``sid`` and check the answer; whether it took a block (None: it failed)."""
        pool, bs = self.pool, self.bs
        toks, table = self.tokens[sid], self.tables[sid]
        p = len(toks)
        slot = p % bs
        shared = slot > 0 and self.others_hold(table[-1], sid)
        before = snapshot(pool)
        got = pool.append(sid, token)
        if got is None:
            event("append: None")
            assert snapshot(pool) == before
            assert (slot == 0 or shared) and pool.free_blocks == 0
            return None
        assert got.slot == slot
        if slot == 0:
            assert got.copied_from is None and got.block not in table
            table.append(got.block)
        elif shared:
            event("append: copy-on-write")
            assert got.copied_from == table[-1] and got.block not in table
            for s in range(slot):  # the caller's copy
                self.write(got.block, s, self.kv[got.copied_from][s])
            table[-1] = got.block
        else:
            assert got.copied_from is None and got.block == table[-1]
        assert not self.others_hold(got.block, sid)
        toks.append(token)
        self.write(got.block, slot, tuple(toks))
        return slot == 0 or shared

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), token=st.sampled_from([0, 1, 2]))
    def decode_step(self, data: st.DataObject, token: int) -> None:
        """One token for each of some live sequences, checked first with ``blocks_needed``."""
        rows = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), unique=True, min_size=1))
        pool = self.pool
        # The model's own count, from its tables alone: a row whose next position starts a block
        # takes one; a row in a not-full last block that another table still holds takes a copy,
        # and leaves that block to the others (so the last of them writes in place).
        holders = {b: sum(b in t for t in self.tables.values()) for t in self.tables.values() for b in t}
        expected = 0
        for sid in rows:
            last = self.tables[sid][-1]
            if len(self.tokens[sid]) % self.bs == 0:
                expected += 1
            elif holders[last] > 1:
                expected += 1
                holders[last] -= 1
        before = snapshot(pool)
        needed = pool.blocks_needed(rows)
        assert snapshot(pool) == before and needed == expected
        free_before = pool.free_blocks
        took = [self.append_to(sid, token) for sid in rows]
        if needed <= free_before:  # the decode step fits: every append succeeds and takes that many
            event("decode step: fits")
            assert None not in took and sum(bool(t) for t in took) == needed
            assert pool.free_blocks == free_before - needed
        else:  # it does not: some append finds no block (the caller would preempt first)
            event("decode step: preempt")
            assert None in took and pool.free_blocks == 0

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sorted(self.tokens)))
        dst, self.next_id = self.next_id, self.next_id + 1
        got = self.pool.fork(src, dst)
        assert got == Allocation(tuple(self.tables[src]), len(self.tokens[src]))
        self.tokens[dst], self.tables[dst] = list(self.tokens[src]), list(self.tables[src])

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def release_before(self, data: st.DataObject) -> None:
        """A sliding-window sequence gives back its blocks wholly before a position (NOTE [released blocks])."""
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        table = self.tables[sid]
        position = data.draw(st.integers(0, len(self.tokens[sid])))
        end = position // self.bs
        gone = [b for b in table[:end] if b != RELEASED]
        free_before = self.pool.free_blocks
        assert self.pool.release_before(sid, position) == len(gone)
        table[:end] = [RELEASED] * end
        # a block no other table holds goes back to the pool (cached or free), one still held stays in use
        assert self.pool.free_blocks == free_before + sum(not self.others_hold(b, sid) for b in gone)
        event(f"release_before: {len(gone)} block(s)")

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), cache=st.sampled_from([True, True, True, False]))
    def free(self, data: st.DataObject, cache: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.pool.free(sid, cache=cache)
        del self.tokens[sid], self.tables[sid]
        assert sid not in self.pool

    @rule()
    def reset(self) -> None:
        self.pool.reset_prefix_cache()
        assert self.pool.cached_blocks == 0

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        pool, bs = self.pool, self.bs
        pool.check()
        assert set(pool.sequences()) == set(self.tokens)
        held = [0] * pool.num_blocks
        for sid, toks in self.tokens.items():
            table = self.tables[sid]
            assert pool.block_table(sid) == tuple(table) and pool.length(sid) == len(toks)
            for b in table:
                if b != RELEASED:
                    held[b] += 1
            for p in range(len(toks)):  # every position's K/V is its own sequence's (where it keeps the block)
                if table[p // bs] != RELEASED:
                    assert self.kv[table[p // bs]][p % bs] == tuple(toks[: p + 1])
        assert [pool.refcount(b) for b in range(pool.num_blocks)] == held
        assert min(held) >= 0
        assert pool.used_blocks == sum(1 for h in held if h) and pool.free_blocks + pool.used_blocks == pool.num_blocks
        assert 0 <= pool.cached_blocks <= pool.free_blocks
        assert 0 <= pool.hit_tokens <= pool.queries_tokens and pool.evictions >= 0
        # A block held by two live sequences holds the same tokens for both.
        for s1, t1 in self.tables.items():
            for s2, t2 in self.tables.items():
                for i, b in enumerate(t1):
                    if s1 < s2 and b != RELEASED and b in t2:
                        j = t2.index(b)
                        assert (
                            i == j and self.tokens[s1][i * bs : (i + 1) * bs] == self.tokens[s2][j * bs : (j + 1) * bs]
                        )
        if not self.prefix_caching:
            assert pool.cached_blocks == 0 and all(pool.key_of(b) is None for b in range(pool.num_blocks))


SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class CollidingMachine(PoolMachine):
    digest = staticmethod(lambda data: b"\0")  # every key equal
    exact_digest = False


class WeakDigestMachine(PoolMachine):
    digest = staticmethod(lambda data: bytes([hashlib.sha256(data).digest()[0] % 3]))  # 3 keys in all
    exact_digest = False


class NoCachingMachine(PoolMachine):
    prefix_caching = False


class WholeBlocksMachine(PoolMachine):
    partial_blocks = False


TestPool = PoolMachine.TestCase
TestPool.settings = SETTINGS
TestPoolCollidingDigest = CollidingMachine.TestCase
TestPoolCollidingDigest.settings = SETTINGS
TestPoolWeakDigest = WeakDigestMachine.TestCase
TestPoolWeakDigest.settings = SETTINGS
TestPoolWholeBlocks = WholeBlocksMachine.TestCase
TestPoolWholeBlocks.settings = SETTINGS
TestPoolNoCaching = NoCachingMachine.TestCase
TestPoolNoCaching.settings = settings(SETTINGS, max_examples=50)
