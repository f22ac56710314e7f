"""Multi-turn LM episodes on one text-environment protocol, ending in the learner core's ``Rollout``.

The protocol, ``TextEnv`` (batched, pure JAX), ``HostTextEnv`` (one episode at a time, in Python) and ``TextStep``,
lives in ``envs.text`` (re-exported here); an env that sets ``TextStep.max_new`` has the rollouts hand it to the
responder (``respond(..., live, max_new=...)``): turns of one episode may have different budgets (MemAgent's memory
updates M + 1, its final answer A + 1) in one compiled scan.

Turn keys: ``k_reset, k_play = split(key)``; turn t gets ``split(k_play, T)[t]``, or with ``env.chain_keys`` the
keys are chained through the turns (``k_play, k_t = split(k_play)``: no [T] array of keys, so a rollout of
thousands of turns holds nothing that grows with T); ``env.split_key`` divides a turn's key (sampler, env).

Two ways a turn's context is built:

``make_rollout(env, respond, turn_tokens)`` -> pure ``rollout(params, key, data) -> Episodes`` (jit it): one
growing sequence per episode, ``prompt, turn 1, obs 1, turn 2, obs 2, ...``; a ``lax.scan`` over the turns samples
each turn on the whole context so far, then steps the env; an ended episode samples nothing more (its rows stop
at once) and keeps its state. ``HostRollout(env, respond, turn_tokens)`` is the same episode with a
``HostTextEnv``: one jitted program per turn samples (and appends) on the device, the env steps on a thread pool;
with ``chunks`` > 1 the batch is cut into chunks so one chunk's env steps overlap another's sampling.

KV cache carried across turns (both, with an ``lm_responder``; ``carry_cache=True``, the default): each episode's
cache lives on the device for the whole episode, sized for it (``episode_cache_len``: P + T N + (T - 1) O slots);
the prompt is prefilled once, a turn decodes from the live cache, and after it only the observation's tokens are
prefilled (per row, ragged lengths, ended rows untouched; ``lm_responder(..., prefill_chunk=C)`` C at a time), so a
turn costs what its own tokens cost instead of re-reading the context (O(T^2) prefill). The draws are those of
re-prefilling (same key: same tokens, log-probs within float tolerance; tested). An episode whose cache exceeds
the model's ``max_seq_len`` is refused (ValueError at trace time, before anything runs). ``carry_cache=False`` (or a
responder that is a plain function, e.g. scripted) calls ``respond`` on the whole context every turn: the
reference the carried path is tested against.
``Episodes.to_rollout(advantages)`` is the learner's ``Rollout``: response = everything after the prompt, ``mask``
its length, ``loss_mask`` 1 only on the tokens the model wrote (observations are context, never trained on).

``make_turn_rollout(env, respond, record=True)``: each turn's prompt is the env's observation alone (a game rendered
for the player to move, a memory-update prompt): ``Turns`` [T, B, ...], one trainable row per (turn, episode);
``record=False`` keeps only the final state (evaluation of long episodes in memory constant in T). An env whose
prompts all start with the same K tokens may declare ``shared_prefix = K``: with an ``lm_responder`` they are
prefilled once per rollout and each turn prefills only the rest (exact; a turn that does not match prefills whole).

Shapes: P = ``env.prompt_tokens``, N = ``turn_tokens`` (the responder's max_new_tokens), O = ``env.obs_tokens``,
T = ``env.max_turns``; the response holds L = T * N + (T - 1) * O tokens (``response_width``), so it never
overflows. ``respond(params, prompts [B, W], prompt_lens [B], key, live [B]) -> SampleOutput`` (``lm_responder``:
the jitted sampler; a row with ``live`` False samples nothing), called with ``max_new=`` [B] too when the env sets
``TextStep.max_new``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import flax
import jax
import jax.numpy as jnp

from jaxrl_reason.envs.text import HostTextEnv, TextEnv, TextStep
from jaxrl_reason.envs.wrappers import where_done
from jaxrl_reason.models.lm.sampler import (DecodeState, SampleOutput, SamplerConfig, decode_turn, extend,
                                               generate, repeat_rows, start_decode)
from jaxrl_reason.models.lm.sequences import join, response_mask
from jaxrl_reason.rl.lm.rollout import Rollout


def response_width(max_turns: int, turn_tokens: int, obs_tokens: int) -> int:
    """L = T * N + (T - 1) * O: the response slots of an episode (every turn full, every observation between)."""
    return max_turns * turn_tokens + (max_turns - 1) * obs_tokens


def check_env(env, turn_tokens: int) -> None:
    for name in ("max_turns", "prompt_tokens", "obs_tokens"):
        if not isinstance(getattr(env, name, None), int) or getattr(env, name) < (0 if name == "obs_tokens" else 1):
            raise ValueError(f"{type(env).__name__}.{name} must be an int >= {0 if name == 'obs_tokens' else 1}, "
                             f"got {getattr(env, name, None)!r}")
    if turn_tokens < 1:
        raise ValueError(f"turn_tokens must be >= 1, got {turn_tokens}")


# ---------------------------------------------------------------------------------------- the context
def write_rows(buf: jax.Array, start: jax.Array, x: jax.Array, n: jax.Array) -> jax.Array:
    """buf [B, L]; each row's x[b, :n[b]] written at buf[b, start[b]:] (nothing past L). Jittable, no loops."""
    w, width = x.shape[1], buf.shape[1]
    idx = start[:, None] + jnp.arange(w, dtype=jnp.int32)[None]
    idx = jnp.where(jnp.arange(w)[None] < n[:, None], idx, width)  # unused slots: dropped
    return buf.at[jnp.arange(buf.shape[0])[:, None], idx].set(x.astype(buf.dtype), mode="drop")


@flax.struct.dataclass
class Context:
    """An episode so far: the prompt [B, P] (prompt_len [B]), then response [B, L] (length [B]) with the loss mask
    [B, L] (1 where the model wrote the token) and the sampler's log-probs [B, L] (0 elsewhere)."""

    prompt: jax.Array
    prompt_len: jax.Array
    response: jax.Array
    length: jax.Array
    loss_mask: jax.Array
    logp: jax.Array

    @staticmethod
    def start(prompt, prompt_len, width: int, pad_id: int) -> "Context":
        b = prompt.shape[0]
        return Context(jnp.asarray(prompt, jnp.int32), jnp.asarray(prompt_len, jnp.int32),
                       jnp.full((b, width), pad_id, jnp.int32), jnp.zeros((b,), jnp.int32),
                       jnp.zeros((b, width), jnp.float32), jnp.zeros((b, width), jnp.float32))

    def append(self, tokens, n, logp=None) -> "Context":
        """Append tokens [B, W] (n [B] of each row); with ``logp`` [B, W] they are the model's (loss mask 1)."""
        n = jnp.asarray(n, jnp.int32)
        model = logp is not None
        mask = write_rows(self.loss_mask, self.length, jnp.full(tokens.shape, float(model), jnp.float32), n)
        logps = self.logp if not model else write_rows(self.logp, self.length, logp, n)
        return self.replace(response=write_rows(self.response, self.length, tokens, n), length=self.length + n,
                            loss_mask=mask, logp=logps)

    def sequences(self, pad_id: int) -> jax.Array:
        """[B, P + L]: each prompt, its response right after it (``join``)."""
        return join(self.prompt, self.prompt_len, self.response, pad_id)


@flax.struct.dataclass
class Episodes:
    """Multi-turn episodes as one sequence each (``make_rollout`` / ``HostRollout``)."""

    seqs: jax.Array  # [B, P + L] int32: prompt, then turns and observations
    prompt_lens: jax.Array  # [B]
    lengths: jax.Array  # [B] response tokens (turns + observations)
    loss_mask: jax.Array  # [B, L] float32: 1 on the model's tokens
    sample_logp: jax.Array  # [B, L] float32: the sampler's log-probs of the model's tokens, 0 elsewhere
    rewards: jax.Array  # [B, T] float32 per turn (0 after the end)
    turns: jax.Array  # [B] int32: the model's turns taken
    done: jax.Array  # [B] bool: the env ended the episode (else it hit max_turns: truncated)
    info: dict = flax.struct.field(default_factory=dict)  # make_rollout: the env's info [T, B, ...]

    @property
    def reward(self) -> jax.Array:
        """[B]: the episode's return (the sum of its turn rewards)."""
        return self.rewards.sum(axis=1)

    def to_rollout(self, advantages: jax.Array | None = None, **fields) -> Rollout:
        """The learner's ``Rollout`` (advantages [B], or None: the learner's estimator makes them from ``fields``'
        ``rewards`` / ``groups``); ``fields``: more of its fields (rewards, groups, ref_logp, extra, ...)."""
        return Rollout(self.seqs, self.prompt_lens, response_mask(self.lengths, self.loss_mask.shape[1]), advantages,
                       sample_logp=self.sample_logp, loss_mask=self.loss_mask, **fields)


def episodes_of(ctx: Context, rewards, turns, done, pad_id: int, info=None) -> Episodes:
    return Episodes(seqs=ctx.sequences(pad_id), prompt_lens=ctx.prompt_len, lengths=ctx.length,
                    loss_mask=ctx.loss_mask, sample_logp=ctx.logp, rewards=rewards, turns=turns, done=done,
                    info=info or {})


def _call(respond, params, prompts, prompt_lens, key, live, max_new):
    """The responder, given the env's per-turn token limit ``max_new`` [B] when it sets one (``TextStep.max_new``)."""
    if max_new is None:
        return respond(params, prompts, prompt_lens, key, live)
    return respond(params, prompts, prompt_lens, key, live, max_new=max_new)


def _limit(first: TextStep, st: TextStep):
    """The next turn's token limit from a step (checked: set at every step iff set at reset)."""
    if (first.max_new is None) != (st.max_new is None):
        raise ValueError("TextStep.max_new must be set at reset and at every step, or never")
    return None if st.max_new is None else jnp.asarray(st.max_new, jnp.int32)


def _turn_keys(env, k_play):
    """-> (carried key, the scan's xs of keys): ``split(k_play, T)`` as xs, or (``env.chain_keys``) k_play carried."""
    return (k_play, None) if env.chain_keys else (None, jax.random.split(k_play, env.max_turns))


def _turn_key(carried, key):
    """-> (carried key, this turn's key): the next of a chain when ``carried`` is a key, else ``key`` (from xs)."""
    if carried is None:
        return None, key
    carried, key = jax.random.split(carried)
    return carried, key


def sample_turn(respond, params, ctx: Context, key, live, pad_id: int, max_new=None):
    """Sample one turn on the whole context; append it (n = 0 for rows not live) -> (ctx, out, n)."""
    out = _call(respond, params, ctx.sequences(pad_id), ctx.prompt_len + ctx.length, key, live, max_new)
    n = jnp.where(live, out.lengths, 0)
    return ctx.append(out.tokens, n, out.logprobs), out, n


# ---------------------------------------------------------------------------------------- responders
class LMResponder:
    """The LM as a responder (``lm_responder``): callable as ``respond(params, prompts [B, W], prompt_lens [B], key,
    live [B], max_new=None) -> SampleOutput`` (the jitted sampler on the whole context), and able to keep each
    episode's KV cache between turns (``make_rollout`` / ``HostRollout`` with ``carry_cache``): `start` prefills the
    prompts into a cache sized for the episode, `turn` samples a turn from the live cache (the same draws as
    ``respond`` on the whole context for the same key), `observe` prefills the observation tokens."""

    def __init__(self, graphdef, config: SamplerConfig, stop_tokens: Sequence[int], stop_sequences=None,
                 prefill_chunk: int | None = None):
        self.graphdef, self.config, self.prefill_chunk = graphdef, config, prefill_chunk
        self.stops = jnp.asarray(list(stop_tokens) or [-1], jnp.int32)
        self.stop_sequences = stop_sequences

    def _args(self, b, live, max_new):
        n = self.config.max_new_tokens
        seqs = None if self.stop_sequences is None else jnp.broadcast_to(self.stop_sequences,
                                                                           (b,) + self.stop_sequences.shape)
        limit = n if max_new is None else jnp.clip(max_new, 0, n)
        return jnp.broadcast_to(self.stops, (b, self.stops.shape[0])), jnp.where(live, limit, 0).astype(jnp.int32), seqs

    def __call__(self, params, prompts, prompt_lens, key, live, max_new=None) -> SampleOutput:
        b, w = prompts.shape
        stops, limit, seqs = self._args(b, live, max_new)
        cfg = dataclasses.replace(self.config, cache_len=w + self.config.max_new_tokens)
        return generate(self.graphdef, params, prompts, prompt_lens, key, stops, limit, seqs, config=cfg)

    def start(self, params, prompts, prompt_lens, cache_len: int) -> DecodeState:
        """Prefill the prompts [B, P] into a cache of ``cache_len`` slots (ValueError past the model's window)."""
        return start_decode(self.graphdef, params, prompts, prompt_lens, cache_len)

    def turn(self, params, dec: DecodeState, key, live, max_new=None) -> tuple[SampleOutput, DecodeState]:
        """One turn from the live cache (at most ``max_new_tokens`` more slots)."""
        stops, limit, seqs = self._args(dec.pos.shape[0], live, max_new)
        return decode_turn(self.graphdef, params, dec, key, stops, limit, seqs, config=self.config)

    def observe(self, params, dec: DecodeState, tokens, n) -> DecodeState:
        """Prefill tokens[b, :n[b]] ([B, O]; n = 0: the row untouched) into the cache (O more slots)."""
        return extend(self.graphdef, params, dec, tokens, n, self.prefill_chunk)


def lm_responder(graphdef, config: SamplerConfig, stop_tokens: Sequence[int], stop_sequences=None,
                 prefill_chunk: int | None = None) -> LMResponder:
    """The LM as a responder: ``respond(params, prompts [B, W], prompt_lens [B], key, live [B], max_new=None) ->
    SampleOutput``, the jitted sampler (``params``: the model's full ``nnx.State``) with a cache of W +
    max_new_tokens, stopping at any of ``stop_tokens`` (ids) or ``stop_sequences`` ([Q, L],
    ``sampler.stop_sequence_array``) or after min(max_new [B], max_new_tokens) tokens (the env's per-turn limit).
    An ``LMResponder``: ``make_rollout`` and ``HostRollout`` carry its KV cache from turn to turn (observations
    prefilled ``prefill_chunk`` tokens at a time, default whole)."""
    return LMResponder(graphdef, config, stop_tokens, stop_sequences, prefill_chunk)


def carries_cache(respond, carry_cache: bool, turn_tokens: int) -> bool:
    """Whether a rollout keeps the responder's cache: ``carry_cache`` and a responder that can (``LMResponder``),
    whose turns fit the episode's (max_new_tokens <= turn_tokens: the cache is planned for N a turn)."""
    if not (carry_cache and all(callable(getattr(respond, m, None)) for m in ("start", "turn", "observe"))):
        return False
    n = getattr(getattr(respond, "config", None), "max_new_tokens", turn_tokens)
    if n > turn_tokens:
        raise ValueError(f"the responder samples up to {n} tokens a turn (max_new_tokens), more than turn_tokens "
                         f"{turn_tokens}: give the rollout turn_tokens >= {n}")
    return True


# ---------------------------------------------------------------------------------------- pure-JAX envs
def make_rollout(env: TextEnv, respond: Callable, turn_tokens: int, pad_id: int = 0,
                 carry_cache: bool = True) -> Callable:
    """-> pure ``rollout(params, key, data) -> Episodes`` (module docstring): ``lax.scan`` over the env's turns,
    each sampling on the whole episode so far: with an ``lm_responder`` (and ``carry_cache``) from the episode's
    KV cache, carried from turn to turn (each observation prefilled into it), else (``carry_cache=False``, or any
    other responder) by calling ``respond`` on the whole context. Keys and per-turn token limits
    (``TextStep.max_new``): the module docstring. ``info``: the env's per-turn info, [T, B, ...] (after an
episode ended: what a step of its kept state gave; read it where the turn was live)."""
    check_env(env, turn_tokens)
    t_max, o = env.max_turns, env.obs_tokens
    width = response_width(t_max, turn_tokens, o)
    carry = carries_cache(respond, carry_cache, turn_tokens)

    def rollout(params, key, data) -> Episodes:
        k_reset, k_play = jax.random.split(key)
        state, first = env.reset(k_reset, data)
        b = first.obs.shape[0]
        ctx = Context.start(first.obs, first.obs_len, width, pad_id)
        dec = start_cache(env, respond, params, ctx, width, turn_tokens) if carry else None

        def turn(carry_, xs):
            state, ctx, dec, done, turns, limit, carried = carry_
            t, key = xs
            carried, key = _turn_key(carried, key)
            k_sample, k_env = env.split_key(key)
            live = ~done
            if carry:
                ctx, out, n, dec = cached_turn(respond, params, ctx, dec, k_sample, live, limit)
            else:
                ctx, out, n = sample_turn(respond, params, ctx, k_sample, live, pad_id, limit)
            new_state, st = env.step(k_env, state, out.tokens, n)
            state = where_done(done, state, new_state)  # an ended episode keeps its state
            ended = live & st.done
            keep = live & ~st.done & (t < t_max - 1)  # the last turn's observation is never read
            obs, n_obs = st.obs[:, :o], jnp.where(keep, jnp.minimum(st.obs_len, o), 0)
            ctx = ctx.append(obs, n_obs)
            if carry and o:  # no observation (the last turn, every episode ended): no slots used
                dec = jax.lax.cond(jnp.any(n_obs > 0), lambda d: respond.observe(params, d, obs, n_obs), lambda d: d,
                                   dec)
            reward = jnp.where(live, st.reward, 0.0).astype(jnp.float32)
            carry_ = (state, ctx, dec, done | ended, turns + live.astype(jnp.int32), _limit(first, st), carried)
            return carry_, (reward, st.info)

        carried, keys = _turn_keys(env, k_play)
        init = (state, ctx, dec, jnp.asarray(first.done, bool), jnp.zeros((b,), jnp.int32), _limit(first, first),
                carried)
        (_, ctx, _, done, turns, *_), (rewards, info) = jax.lax.scan(turn, init, (jnp.arange(t_max), keys))
        return episodes_of(ctx, rewards.T, turns, done, pad_id, info)

    return rollout


def episode_cache_len(prompt_tokens: int, max_turns: int, turn_tokens: int, obs_tokens: int) -> int:
    """KV-cache slots of one carried episode: the prompt, T turns, T - 1 observations (P + T N + (T - 1) O)."""
    return prompt_tokens + response_width(max_turns, turn_tokens, obs_tokens)


def episode_cache_bytes(model_cfg, batch: int, prompt_tokens: int, max_turns: int, turn_tokens: int,
                        obs_tokens: int) -> int:
    """Bytes of the KV cache a carried rollout of ``batch`` episodes holds on the device for the whole episode
    (``episode_cache_len`` slots of ``model_cfg``'s cache, with its slot-position index), from the cache's shapes."""
    from jaxrl_reason.models.lm.model import init_cache

    slots = episode_cache_len(prompt_tokens, max_turns, turn_tokens, obs_tokens)
    cache = jax.eval_shape(lambda: init_cache(model_cfg, batch, slots))
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache)))


def start_cache(env, respond, params, ctx: Context, width: int, turn_tokens: int) -> DecodeState:
    """The episode's cache (prompt prefilled); an episode past the model's window refused (at trace time)."""
    p = ctx.prompt.shape[1]
    try:
        return respond.start(params, ctx.prompt, ctx.prompt_len, p + width)
    except ValueError as e:
        raise ValueError(f"{type(env).__name__}: an episode needs a KV cache of P + T N + (T - 1) O = {p} + "
                         f"{env.max_turns} x {turn_tokens} + {env.max_turns - 1} x {env.obs_tokens} = {p + width} "
                         f"tokens; the model cannot hold it ({e}). Fewer turns, shorter turns or observations, or a "
                         f"model with a longer max_seq_len") from e


def cached_turn(respond, params, ctx: Context, dec: DecodeState, key, live, max_new=None):
    """Sample one turn from the carried cache; append it (n = 0 for rows not live) -> (ctx, out, n, dec)."""
    out, dec = respond.turn(params, dec, key, live, max_new)
    n = jnp.where(live, out.lengths, 0)
    return ctx.append(out.tokens, n, out.logprobs), out, n, dec


@flax.struct.dataclass
class Turns:
    """``make_turn_rollout``'s records, one row per (turn, episode): [T, B, ...]."""

    prompts: jax.Array  # [T, B, P] the observation the turn answered
    prompt_lens: jax.Array  # [T, B]
    tokens: jax.Array  # [T, B, N]
    logprobs: jax.Array  # [T, B, N]
    lengths: jax.Array  # [T, B]
    live: jax.Array  # [T, B] bool: the episode had not ended before the turn
    reward: jax.Array  # [T, B]
    done: jax.Array  # [T, B] bool: ended at this turn or before
    info: dict  # the env's info [T, B, ...] (SPIRAL's games: the seat that moved, an LM turn of a live game, the parse)

    def to_rollout(self, advantages: jax.Array | None = None, active: jax.Array | None = None, pad_id: int = 0,
                   **fields) -> Rollout:
        """Rows = (turn, episode), turn-major; advantages [T, B], or None: the learner's estimator makes them from
        ``fields`` (``rewards`` [S], ``groups``, ``valid``, ``sample`` [T * B]: each row's sample, e.g. SPIRAL's
        (episode, seat)); ``active`` [T, B] (default ``live``): trained rows."""
        t, b, n = self.tokens.shape
        flat = lambda x: x.reshape((t * b,) + x.shape[2:])
        active = self.live if active is None else active
        seqs = join(flat(self.prompts), flat(self.prompt_lens), flat(self.tokens), pad_id)
        return Rollout(seqs, flat(self.prompt_lens), response_mask(flat(self.lengths), n, flat(active)),
                       None if advantages is None else flat(advantages), sample_logp=flat(self.logprobs), **fields)


def make_turn_rollout(env: TextEnv, respond: Callable, record: bool = True, carry_cache: bool = True,
                      pad_id: int | None = None) -> Callable:
    """-> pure ``rollout(params, key, data) -> (Turns, final state)``: each turn the model answers the env's latest
    observation alone (``obs_tokens`` = ``prompt_tokens``). Every row samples every turn (``live`` tells the
    responder which episodes still run); keys and per-turn limits as in ``make_rollout``; an ended episode keeps its
    state. ``record=False``: ``(None, final state)``, nothing kept per turn (memory constant in T).

    Shared prefix (opt-in): an env whose every prompt starts with the same K tokens (every row, every turn) may say
    so with ``shared_prefix = K``; with an ``lm_responder`` (and ``carry_cache``) those K tokens are prefilled once
    per rollout (one row) and each turn prefills only the rest of each prompt on a copy of that cache: the same
    draws as without (tokens; log-probs within float tolerance). A turn whose live prompts do not start with the
    prefix (reset's first full-length row's) prefills them whole: a wrong declaration costs time, never exactness.

    A live row whose observation is empty (``obs_len`` 0: another player moves) is not asked that turn: the
    responder sees it not live (``Turns.live`` still says the episode runs). A turn where no row is asked (every
    episode ended, or only other players move) does not run the responder (``unless_idle``: pad, length 0) when the
    pad id is known: ``pad_id``, else the responder's ``config.pad_id`` (an ``lm_responder``); a plain function
    without ``pad_id`` is called every turn."""
    check_env(env, 1)
    if env.obs_tokens != env.prompt_tokens:
        raise ValueError(f"make_turn_rollout: obs_tokens ({env.obs_tokens}) must equal prompt_tokens "
                         f"({env.prompt_tokens}): each observation is the next prompt")
    k = getattr(env, "shared_prefix", 0)
    if not isinstance(k, int) or not 0 <= k <= env.prompt_tokens:
        raise ValueError(f"{type(env).__name__}.shared_prefix must be an int in [0, prompt_tokens], got {k!r}")
    n_max = getattr(getattr(respond, "config", None), "max_new_tokens", 1)
    share = k > 0 and carries_cache(respond, carry_cache, n_max)
    pad = getattr(getattr(respond, "config", None), "pad_id", None) if pad_id is None else pad_id

    def rollout(params, key, data):
        k_reset, k_play = jax.random.split(key)
        state, first = env.reset(k_reset, data)
        resp = (_shared_prefix(respond, k, env.prompt_tokens + n_max, params, first.obs, first.obs_len) if share
                else respond)

        def turn(carry, key):
            state, obs, obs_len, done, limit, carried = carry  # (the info's keys may differ between reset and step)
            carried, key = _turn_key(carried, key)
            k_sample, k_env = env.split_key(key)
            live = ~done
            ask = live & (obs_len > 0)
            run = lambda: _call(resp, params, obs, obs_len, k_sample, ask, limit)
            out = run() if pad is None else unless_idle(run, ask, pad)
            new_state, st = env.step(k_env, state, out.tokens, out.lengths)
            state = where_done(done, state, new_state)
            reward, ended = jnp.where(live, st.reward, 0.0), done | st.done
            rec = Turns(prompts=obs, prompt_lens=obs_len, tokens=out.tokens, logprobs=out.logprobs,
                        lengths=out.lengths, live=live, reward=reward, done=ended, info=st.info) if record else None
            return (state, st.obs, st.obs_len, ended, _limit(first, st), carried), rec

        carried, keys = _turn_keys(env, k_play)
        init = (state, first.obs, first.obs_len, jnp.asarray(first.done, bool), _limit(first, first), carried)
        (state, *_), turns = jax.lax.scan(turn, init, keys, length=env.max_turns)
        return turns, state

    return rollout


def _shared_prefix(respond: "LMResponder", k: int, cache_len: int, params, obs, obs_len) -> Callable:
    """``make_turn_rollout``'s responder with the prefix obs[r, :k] (r: reset's first row that holds it) prefilled
    once, its cache copied into each turn's; a turn whose live prompts do not all start with it prefills them whole."""
    prefix = obs[jnp.argmax(obs_len >= k), :k]
    base = respond.start(params, prefix[None], jnp.full((1,), k, jnp.int32), cache_len)

    def turn(params, prompts, prompt_lens, key, live, max_new=None):
        b = prompts.shape[0]
        fits = jnp.all(~live[:, None] | ((prompts[:, :k] == prefix[None]) & (prompt_lens >= k)[:, None]))

        def shared():
            return respond.observe(params, repeat_rows(base, b), prompts[:, k:], jnp.where(live, prompt_lens - k, 0))

        dec = jax.lax.cond(fits, shared, lambda: respond.start(params, prompts, prompt_lens, cache_len))
        return respond.turn(params, dec, key, live, max_new)[0]

    return turn


def unless_idle(run: Callable[[], SampleOutput], live, pad_id: int) -> SampleOutput:
    """``run()`` (a responder's turn) when any row of ``live`` [B] is, else its output's shapes filled with pad,
    log-prob 0, length 0 without running it (``lax.cond``: a turn where every episode ended, or no row is asked)."""
    shapes = jax.eval_shape(run)
    nothing = lambda: SampleOutput(tokens=jnp.full(shapes.tokens.shape, pad_id, shapes.tokens.dtype),
                                   logprobs=jnp.zeros(shapes.logprobs.shape, shapes.logprobs.dtype),
                                   lengths=jnp.zeros(shapes.lengths.shape, shapes.lengths.dtype))
    return jax.lax.cond(jnp.any(live), run, nothing)


__all__ = ["Context", "Episodes", "HostTextEnv", "LMResponder", "TextEnv", "TextStep", "Turns", "cached_turn",
           "carries_cache", "check_env", "episode_cache_bytes", "episode_cache_len", "episodes_of", "lm_responder",
           "make_rollout", "make_turn_rollout", "response_width", "sample_turn", "start_cache", "unless_idle",
           "write_rows"]
