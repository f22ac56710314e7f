"""The host-environment path of the multi-turn engine (``rl.lm.multiturn``): ``HostRollout`` steps a
``HostTextEnv`` (a Python tool, a checker) on host threads between the device's turn programs, each episode's KV
cache carried on the device from turn to turn (``rl.lm.multiturn``'s docstring says how; ``carry_cache=False``
re-prefills the context, the reference).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.text import HostTextEnv
from jaxrl_reason.rl.lm.multiturn import (Context, Episodes, cached_turn, carries_cache, check_env, episodes_of,
                                          response_width, sample_turn, start_cache)


# ---------------------------------------------------------------------------------------- host envs
class HostRollout:
    """Episodes of a ``HostTextEnv``: ``episodes, states = HostRollout(env, respond, turn_tokens)(params, key, rows)``.

    Per turn and chunk of rows: one jitted device program samples the turn (from the chunk's carried KV cache, as
    ``make_rollout``; ``carry_cache=False``: on the whole context) and appends it;
    the env steps that chunk's episodes on a thread pool while the device samples the next chunk (``chunks`` > 1:
    overlap; a chunk's draws then use ``fold_in(sampler key, chunk)``; with one chunk the keys, so the draws, are
    ``make_rollout``'s); the observations are appended on the device
    (and prefilled into its cache) before the chunk's next turn. Stops early once every episode has ended. ``states``: the env's episode objects
    (their counters, for metrics). An observation or prompt longer than the env's widths raises ValueError."""

    def __init__(self, env: HostTextEnv, respond: Callable, turn_tokens: int, pad_id: int = 0, chunks: int = 1,
                 workers: int | None = None, carry_cache: bool = True):
        check_env(env, turn_tokens)
        if chunks < 1:
            raise ValueError(f"HostRollout: chunks must be >= 1, got {chunks}")
        self.env, self.turn_tokens, self.pad_id, self.chunks = env, turn_tokens, pad_id, chunks
        self.width = response_width(env.max_turns, turn_tokens, env.obs_tokens)
        self.pool = ThreadPoolExecutor(max_workers=workers or chunks, thread_name_prefix="text-env")
        self.carry_cache = carries_cache(respond, carry_cache, turn_tokens)
        if self.carry_cache:  # the chunk's cache (DecodeState) travels beside its context
            self._start = jax.jit(lambda params, ctx: start_cache(env, respond, params, ctx, self.width, turn_tokens))
            # the cache is donated: each program updates it in place (no copy of it a turn)
            self._turn = jax.jit(lambda params, ctx, dec, key, live: cached_turn(respond, params, ctx, dec, key, live),
                                 donate_argnums=2)
            self._observe_cache = jax.jit(lambda params, ctx, dec, obs, n: (ctx.append(obs, n),
                                                                             respond.observe(params, dec, obs, n)),
                                          donate_argnums=2)
        else:
            self._turn = jax.jit(lambda params, ctx, dec, key, live: (
                *sample_turn(respond, params, ctx, key, live, pad_id), None))
        self._observe = jax.jit(lambda ctx, obs, n: ctx.append(obs, n))

    def _pad(self, seqs, width: int, what: str):
        arr = np.full((len(seqs), max(width, 1)), self.pad_id, np.int32)
        lens = np.zeros(len(seqs), np.int32)
        for i, s in enumerate(seqs):
            if len(s) > width:
                raise ValueError(f"{type(self.env).__name__}: a {what} of {len(s)} tokens exceeds its width {width}")
            arr[i, : len(s)], lens[i] = s, len(s)
        return arr[:, :width], lens

    def _step_rows(self, states, rows, tokens, lengths, live):
        """Host: step the live episodes ``rows`` -> (obs ids lists, rewards, dones) for those rows."""
        obs, rewards, dones = [], np.zeros(len(rows), np.float32), np.ones(len(rows), bool)
        for j, i in enumerate(rows):
            if not live[j]:
                obs.append([])
                continue
            states[i], o, r, d = self.env.step(states[i], tokens[j, : lengths[j]].tolist())
            obs.append(list(o))
            rewards[j], dones[j] = float(r), bool(d)
        return obs, rewards, dones

    def __call__(self, params, key, rows: Sequence) -> tuple[Episodes, list]:
        env, b = self.env, len(rows)
        if b < 1:
            raise ValueError("HostRollout: no rows")
        reset = list(self.pool.map(env.reset, rows))
        states = [s for s, _ in reset]
        prompt, plen = self._pad([p for _, p in reset], env.prompt_tokens, "prompt")
        cuts = np.array_split(np.arange(b), min(self.chunks, b))
        ctxs = [Context.start(prompt[c], plen[c], self.width, self.pad_id) for c in cuts]
        decs = [self._start(params, ctx) if self.carry_cache else None for ctx in ctxs]
        live = [np.ones(len(c), bool) for c in cuts]
        rewards = np.zeros((b, env.max_turns), np.float32)
        turns, done = np.zeros(b, np.int32), np.zeros(b, bool)
        pending = [None] * len(cuts)
        keys = jax.random.split(jax.random.split(key)[1], env.max_turns)  # make_rollout's keys: same draws
        for t in range(env.max_turns):
            outs = []
            for c, rows_c in enumerate(cuts):
                if pending[c] is not None:  # the chunk's last env step: append its observations, then sample
                    (obs, r, d), pending[c] = pending[c].result(), None
                    prev = live[c]
                    rewards[rows_c, t - 1], done[rows_c] = np.where(prev, r, 0.0), done[rows_c] | (prev & d)
                    live[c] = prev & ~d
                    arr, n = self._pad(obs, env.obs_tokens, "observation")
                    n = np.where(live[c], n, 0)
                    if self.carry_cache and n.any():  # prefilled into the chunk's cache
                        ctxs[c], decs[c] = self._observe_cache(params, ctxs[c], decs[c], arr, n)
                    else:
                        ctxs[c] = self._observe(ctxs[c], arr, n)
                if not live[c].any():
                    outs.append(None)
                    continue
                k = jax.random.split(keys[t])[0]  # TextEnv.split_key's default
                k = k if len(cuts) == 1 else jax.random.fold_in(k, c)
                ctxs[c], out, _, decs[c] = self._turn(params, ctxs[c], decs[c], k, live[c])
                turns[rows_c] += live[c]
                outs.append(out)
            if all(o is None for o in outs):
                break
            for c, rows_c in enumerate(cuts):  # each chunk's tokens as soon as they exist: its env steps start
                if outs[c] is None:
                    pending[c] = None
                    continue
                tokens, lengths = jax.device_get((outs[c].tokens, outs[c].lengths))
                pending[c] = self.pool.submit(self._step_rows, states, rows_c, tokens, lengths, live[c].copy())
        for c, rows_c in enumerate(cuts):  # the last turn's steps: rewards and dones (no observation)
            if pending[c] is not None:
                _, r, d = pending[c].result()
                rewards[rows_c, t] = np.where(live[c], r, 0.0)
                done[rows_c] |= live[c] & d
        ctx = jax.tree.map(lambda *x: jnp.concatenate(x), *ctxs)
        return episodes_of(ctx, jnp.asarray(rewards), jnp.asarray(turns), jnp.asarray(done), self.pad_id), states

    def close(self):
        self.pool.shutdown(wait=True)


__all__ = ["HostRollout"]
