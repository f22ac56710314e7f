"""Multi-turn, multi-agent LM episodes on device: render -> sample -> parse -> step, all turns of
a batch of games in one ``lax.scan`` (no Python per turn): a game is a ``GameTextEnv`` in the one multi-turn engine
(``rl.lm.multiturn.make_turn_rollout``, its ``Turns`` and ``lm_responder``).

    game = LMGame.make("kuhn_poker", tokenizer=spiral_tokenizer())   # agents.spiral.tokenizer
    roll = game_rollout(graphdef, game, num_episodes=64, sampler=SamplerConfig(max_new_tokens=24))
    turns, games = jax.jit(roll)(params, key)   # params: the LM's nnx.State; Turns [T, B, ...], Games [B]

Each turn the player to move sees its own prompt (``[bos] + text.render(state, player)``, each byte
mapped to the tokenizer's id of that character, ``models.tokenizer.byte_ids``: byte + 8 for the
presets' byte tokenizer; static length ``P``), the LM samples a response (stopping at the tokenizer's
eos), the response ids become their bytes (``token_bytes``: multi-character tokens of a BPE included),
``text.parse`` reads the last ``\\boxed{...}`` and the environment steps. An unparseable or illegal answer is passed to
``env.step`` as is, so the game's illegal-action rule applies: the game ends, the offender gets
``-penalty`` (a forfeit, as in SPIRAL). With ``opponent`` set, the LM plays only seat
``lm_seat[b]`` (alternating 0/1 over the batch) and the opponent function plays the other seat;
only LM turns are ``active`` (trainable).

``Turns`` (``rl.lm.multiturn``) holds the per-turn ``[T, B, ...]`` arrays (``T = env.max_episode_steps``), SPIRAL's
in its ``info``: ``player`` (the seat that acted), ``active`` (a live LM turn: trainable), ``status`` (the parse);
turns after a game ended are inactive padding. ``Games`` (the env's final state) holds each game's ``returns``
[B, 2], ``forfeit`` [B, 2], ``lm_seat`` [B] and ``finished``. ``python_rollout`` is the same rollout driven turn by
turn from Python with host-side string parsing (the benchmark's reference; same keys -> same games).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.games import GAMES as GAME_SPECS
from jaxrl_reason.envs.games import GameSpec
from jaxrl_reason.envs.games import game_spec
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.envs.wrappers import where_done
from jaxrl_reason.agents.spiral.tokenizer import check_text
from jaxrl_reason.models.lm.sampler import SampleOutput, SamplerConfig
from jaxrl_reason.models.tokenizer import UNKNOWN, Tokenizer, byte_ids, byte_offset, host_bytes, token_bytes
from jaxrl_reason.parallel.mesh import split_along
from jaxrl_reason.rl.lm.multiturn import TextEnv, TextStep, lm_responder, make_turn_rollout

#: the games SPIRAL plays: every registered one (``envs.games.register_game``), in registration order
GAMES = tuple(GAME_SPECS)


@dataclasses.dataclass(frozen=True, eq=False)
class LMGame:
    """A registered game (``spec``: ``envs.games.GameSpec``) with its env and text interface in the ids of
    ``tokenizer`` (``byte_ids``: byte -> id for the prompts; ``token_bytes``: id -> bytes for the answers).
    ``prompt_len`` counts the leading bos."""

    name: str
    env: object
    text: gtext.GameText
    tokenizer: Tokenizer
    spec: GameSpec

    @staticmethod
    def make(name: str, style: str = "verbose", *, tokenizer: Tokenizer, **env_kwargs) -> "LMGame":
        """``style``: the prompt style of the text interface (``envs.games.text.STYLES``); ``tokenizer``:
        the LM's (``agents.spiral.tokenizer.spiral_tokenizer()`` for the presets), which must spell every
        character of the game's text as one token (ValueError naming the first that is not)."""
        if name not in GAME_SPECS:
            raise ValueError(f"unknown SPIRAL game {name!r}; choose from {tuple(GAME_SPECS)}")
        spec = game_spec(name)
        env = spec.make_env(**env_kwargs)
        text = spec.make_text(env, style)
        check_text(tokenizer, _game_chars(text), f"{name} game text")
        return LMGame(name=name, env=env, text=text, tokenizer=tokenizer, spec=spec)

    @property
    def offset(self) -> int:
        """Id of byte 0 of a ``ByteTokenizer`` (its prompt ids are ``text.render(..., offset)``)."""
        return byte_offset(self.tokenizer)

    @property
    def prompt_len(self) -> int:
        return 1 + self.text.prompt_length

    @property
    def prefix_len(self) -> int:
        """Ids every prompt of the game starts with: bos + the rules before the template's first slot."""
        return 1 + self.text.template.prefix_length

    @property
    def max_turns(self) -> int:
        return int(self.env.max_episode_steps)


def _game_chars(text: gtext.GameText) -> str:
    """Every character a game's prompts and canonical answers use, in order of first appearance."""
    seen = dict.fromkeys(gtext.to_str(np.concatenate([t.reshape(-1) for _, t in text.template.parts])))
    seen.update(dict.fromkeys(gtext.BOXED + "}" + "".join(text.action_strings)))
    return "".join(seen)




def response_bytes(tokenizer: Tokenizer, tokens: jax.Array) -> jax.Array:
    """Generated ids ``[..., N]`` -> their bytes ``[..., N * K]`` (``token_bytes``: the ids' spellings
    concatenated, then -1); an id outside the tokenizer's vocabulary is one unknown byte (-1)."""
    table, lengths = token_bytes(tokenizer)
    v, k = table.shape
    tokens = jnp.asarray(tokens, jnp.int32)
    inside = (tokens >= 0) & (tokens < v)
    idx = jnp.clip(tokens, 0, v - 1)
    if k == 1:  # one byte per id (the byte tokenizer): a lookup
        return jnp.where(inside, jnp.asarray(table[:, 0])[idx].astype(jnp.int32), UNKNOWN)
    spell = jnp.where(inside[..., None], jnp.asarray(table)[idx].astype(jnp.int32), UNKNOWN)  # [..., N, K]
    count = jnp.where(inside, jnp.asarray(lengths)[idx], 1)  # [..., N] bytes per id
    n = tokens.shape[-1]

    def concat(spell, count):  # [N, K], [N] -> [N * K]
        pos = (jnp.cumsum(count) - count)[:, None] + jnp.arange(k)
        pos = jnp.where(jnp.arange(k) < count[:, None], pos, n * k)  # unused slots: dropped
        return jnp.full((n * k,), UNKNOWN, jnp.int32).at[pos.reshape(-1)].set(spell.reshape(-1), mode="drop")

    lead = tokens.shape[:-1]
    out = jax.vmap(concat)(spell.reshape((-1, n, k)), count.reshape((-1, n)))
    return out.reshape(lead + (n * k,))


@flax.struct.dataclass
class Games:
    """A batch of games, ``GameTextEnv``'s state (the final one: what ``game_rollout`` returns beside its ``Turns``)."""

    state: Any  # the env's state [B, ...]
    ts: Any  # its last timestep [B, ...]
    returns: jax.Array  # [B, 2] float32 episode return per seat
    forfeit: jax.Array  # [B, 2] bool: seat forfeited (LM answer unparseable / illegal)
    lm_seat: jax.Array  # [B] int32 LM seat (-1: self-play, the LM plays both)

    @property
    def finished(self) -> jax.Array:
        """[B] bool: the game ended (terminated or truncated at ``max_turns``)."""
        return self.ts.terminated | self.ts.truncated


def _mask_lm_seat(num_episodes: int, with_opponent: bool) -> jax.Array:
    return jnp.arange(num_episodes, dtype=jnp.int32) % 2 if with_opponent else jnp.full((num_episodes,), -1, jnp.int32)


def _render(game: LMGame, state, player):
    """Batched prompts ``[B, P]``: bos + the rendered bytes, each mapped to its id (``byte_ids``)."""
    body = jax.vmap(game.text.render, in_axes=(0, 0, None))(state, player, 0)  # bytes
    body = jnp.asarray(byte_ids(game.tokenizer))[body]
    return jnp.concatenate([jnp.full((body.shape[0], 1), game.tokenizer.bos_id, jnp.int32), body], axis=1)


def _parse(game: LMGame, tokens, legal):
    """Batched device parse of response ids ``[B, N]`` -> (action [B], status [B])."""
    return jax.vmap(game.text.parse, in_axes=(0, 0, None))(response_bytes(game.tokenizer, tokens), legal, 0)


def game_responder(graphdef, sampler: SamplerConfig, *, tokenizer: Tokenizer) -> Callable:
    """The LM as a game's responder: ``rl.lm.multiturn.lm_responder`` (the jitted sampler) stopping at the tokenizer's
    eos, padding with its pad: ``respond(params, prompts [B, P], prompt_lens [B], key, live [B]) -> SampleOutput``
    (a row not ``live`` samples nothing: length 0, all pad; the live rows' draws are unchanged)."""
    return lm_responder(graphdef, dataclasses.replace(sampler, pad_id=tokenizer.pad_id), [tokenizer.eos_id])


def canned_answers(answers: tuple[str, ...], num_new: int, slots: int | None = None, *, tokenizer: Tokenizer):
    """Answer table for ``canned_responder``: ``(tokens [K, num_new], lengths [K])`` with the answers
    (each encoded as plain text + eos, padded with pad) cycled to ``slots`` rows (default ``len(answers)``)."""
    encoded = [tokenizer.encode(a) + [tokenizer.eos_id] for a in answers]
    if not answers or max(map(len, encoded)) > num_new:
        raise ValueError(f"need at least one answer and num_new > the longest answer, got {num_new}")
    k = slots or len(answers)
    table, lens = tokenizer.pad_batch([encoded[i % len(answers)] for i in range(k)], num_new)
    return jnp.asarray(table), jnp.asarray(lens)


def canned_responder(params, prompts, prompt_lens, key, live) -> SampleOutput:
    """A scripted player for tests and demos: ``params = canned_answers(...)``; each row answers one
    of the table's answers uniformly at random (the prompt is ignored; a row not ``live`` answers length 0).
    The LM responder's signature, so one compiled rollout serves every answer table of the same shape."""
    table, lens = params
    pick = jax.random.randint(key, (prompts.shape[0],), 0, table.shape[0])
    return SampleOutput(tokens=table[pick], logprobs=jnp.zeros(table[pick].shape, jnp.float32),
                        lengths=jnp.where(live, lens[pick], 0))


class GameTextEnv(TextEnv):
    """A SPIRAL game as a ``rl.lm.multiturn.TextEnv`` whose observation is the whole next prompt (the game rendered
    for the player to move; ``make_turn_rollout``); its reward is the mover's. State: ``Games`` (the env's state and
    timestep, returns and forfeits per seat, the LM's seat); ``info`` [B]: player, active (an LM turn of a live
    game), status (the parse). A turn's key is split in three (sampler, opponent, env)."""

    def __init__(self, game: LMGame, num_episodes: int, opponent: Callable | None = None, mesh=None):
        self.game, self.b, self.opponent, self.mesh = game, num_episodes, opponent, mesh
        self.max_turns = game.max_turns
        self.prompt_tokens = self.obs_tokens = game.prompt_len
        self.shared_prefix = game.prefix_len  # prefilled once per rollout (make_turn_rollout)

    def split_key(self, key):
        k_lm, k_opp, k_env = jax.random.split(key, 3)
        return k_lm, (k_opp, k_env)

    def _observe(self, games: Games, reward):
        """The prompt for the player to move; its length 0 where a fixed opponent moves (the LM reads nothing:
        ``make_turn_rollout`` asks only rows with a prompt)."""
        ts = games.ts
        prompts = _render(self.game, games.state, ts.current_player)
        lm_turn = (games.lm_seat < 0) | (ts.current_player == games.lm_seat)
        return TextStep(prompts, jnp.where(lm_turn, self.game.prompt_len, 0).astype(jnp.int32), reward, games.finished)

    def reset(self, key, data=None):
        state, ts = split_along(jax.vmap(self.game.env.reset)(jax.random.split(key, self.b)), self.mesh, 0)
        games = Games(state=state, ts=ts, returns=jnp.zeros((self.b, 2), jnp.float32),
                      forfeit=jnp.zeros((self.b, 2), bool), lm_seat=_mask_lm_seat(self.b, self.opponent is not None))
        return games, self._observe(games, jnp.zeros((self.b,), jnp.float32))

    def step(self, key, games: Games, turn, turn_len):
        games = split_along(games, self.mesh, 0)
        state, ts, lm_seat = games.state, games.ts, games.lm_seat
        k_opp, k_env = key
        env, b = self.game.env, self.b
        done = games.finished
        player = ts.current_player
        _, legal = mover_view(ts)
        action, status = _parse(self.game, turn, legal)
        lm_turn = (lm_seat < 0) | (player == lm_seat)
        if self.opponent is not None:
            opp = jax.vmap(self.opponent)(jax.random.split(k_opp, b), state, ts)
            action = jnp.where(lm_turn, action, opp)
        active = ~done & lm_turn
        new_state, new_ts = jax.vmap(env.step)(jax.random.split(k_env, b), state, action)
        state, ts = where_done(done, (state, ts), (new_state, new_ts))  # ended games stay
        reward = jnp.where(done[:, None], 0.0, new_ts.reward)
        bad = active & (status != gtext.OK)
        forfeit = games.forfeit | (bad[:, None] & (jnp.arange(2)[None] == player[:, None]))
        games = games.replace(state=state, ts=ts, returns=games.returns + reward, forfeit=forfeit)
        st = self._observe(games, jnp.take_along_axis(reward, player[:, None], axis=1)[:, 0])  # the mover's
        return games, st.replace(info={"player": player, "active": active, "status": status})


def game_rollout(graphdef, game: LMGame, num_episodes: int, sampler: SamplerConfig,
                 opponent: Callable | None = None, responder: Callable | None = None, mesh=None) -> Callable:
    """-> pure ``rollout(params, key) -> (Turns [T, B, ...], Games [B])`` (jit it, or call it inside a jitted step):
    the game as a ``GameTextEnv`` in the multi-turn engine's ``make_turn_rollout``.

    ``params``: the LM's full ``nnx.State``. ``opponent(key, state, ts) -> action`` acts on one
    unbatched game (one of the game's ``GameSpec.opponents``); None = self-play (the LM plays both seats).
    ``responder(params, prompts, prompt_lens, key, live) -> SampleOutput`` replaces the LM sampler (scripted players
    in tests: ``canned_responder``); default ``game_responder``. ``mesh``: the games are split over its ``data`` axis
    (each device, of every process, plays its slice of the one seeded batch; the same games as without a mesh).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    respond = responder or game_responder(graphdef, sampler, tokenizer=game.tokenizer)
    roll = make_turn_rollout(GameTextEnv(game, num_episodes, opponent, mesh), respond, pad_id=game.tokenizer.pad_id)
    return lambda params, key: roll(params, key, None)


def python_rollout(graphdef, game: LMGame, num_episodes: int, sampler: SamplerConfig, params, key,
                   opponent: Callable | None = None, responder: Callable | None = None) -> dict:
    """The same rollout driven turn by turn from Python (reference for the benchmark and tests).

    Per turn: a jitted render + sample call, the answers decoded to strings and parsed on the host
    (``parse_text``, as a text-arena harness does), a jitted env step; stops as soon as every
    game has ended. Returns numpy ``{"returns" [B, 2], "forfeit" [B, 2], "status" [T, B]}``."""
    b = num_episodes
    fns = _python_fns(graphdef, game, b, sampler, opponent, responder)
    k_reset, k_play = jax.random.split(key)
    state, ts = fns["reset"](k_reset)
    lm_seat = np.asarray(_mask_lm_seat(b, opponent is not None))
    ret, forfeit = np.zeros((b, 2), np.float32), np.zeros((b, 2), bool)
    statuses = np.zeros((game.max_turns, b), np.int32)
    for t, k in enumerate(jax.random.split(k_play, game.max_turns)):
        k_lm, k_opp, k_env = jax.random.split(k, 3)
        done, player, legal, tokens, opp = jax.device_get(fns["sample"](params, state, ts, k_lm, k_opp))
        if done.all():
            break
        actions = np.zeros(b, np.int32)
        for i in range(b):
            if done[i]:
                continue
            lm_turn = lm_seat[i] < 0 or player[i] == lm_seat[i]
            if lm_turn:
                a, status = parse_text(game.text, host_text(tokens[i], tokenizer=game.tokenizer), legal[i])
                statuses[t, i] = status
                if status != gtext.OK:
                    forfeit[i, player[i]] = True
                actions[i] = a
            else:
                actions[i] = opp[i]
        state, ts, reward = jax.device_get(fns["step"](k_env, state, ts, jnp.asarray(actions)))
        ret += np.where(done[:, None], 0.0, reward)
    return {"returns": ret, "forfeit": forfeit, "status": statuses}


def host_text(ids, *, tokenizer: Tokenizer) -> str:
    """LM ids -> a Python string, byte by byte as the device parser reads them (``token_bytes``: bytes as
    ``chr``, unknown bytes -- special tokens, non-ASCII tokens -- as ``"\\x00"``)."""
    return "".join(chr(b) if b >= 0 else "\x00" for b in host_bytes(ids, tokenizer))


def parse_text(text: gtext.GameText, answer: str, legal) -> tuple[int, int]:
    """Host-side (pure Python) twin of ``GameText.parse``: ``(action, status)``."""
    start = answer.rfind(gtext.BOXED)
    if start < 0:
        return gtext.INVALID_ACTION, gtext.NO_ANSWER
    seg = answer[start + len(gtext.BOXED): start + len(gtext.BOXED) + text.window]
    end = seg.find("}")
    if end < 0:
        return gtext.INVALID_ACTION, gtext.NO_ANSWER
    content = "".join(c.lower() if "A" <= c <= "Z" else c for c in seg[:end] if c not in " \t\n\r")
    canon = [a.lower().replace(" ", "") for a in text.action_strings]
    if content not in canon:
        return gtext.INVALID_ACTION, gtext.UNKNOWN
    a = canon.index(content)
    return a, (gtext.OK if legal[a] else gtext.ILLEGAL)


def _python_fns(graphdef, game: LMGame, b: int, sampler: SamplerConfig, opponent, responder):
    env = game.env
    respond = responder or game_responder(graphdef, sampler, tokenizer=game.tokenizer)
    plens, live = jnp.full((b,), game.prompt_len, jnp.int32), jnp.ones((b,), bool)  # every row samples

    @jax.jit
    def reset(key):
        return jax.vmap(env.reset)(jax.random.split(key, b))

    @jax.jit
    def sample(params, state, ts, k_lm, k_opp):
        _, legal = mover_view(ts)
        out = respond(params, _render(game, state, ts.current_player), plens, k_lm, live)
        opp = (jax.vmap(opponent)(jax.random.split(k_opp, b), state, ts) if opponent is not None
               else jnp.zeros((b,), jnp.int32))
        return ts.terminated | ts.truncated, ts.current_player, legal, out.tokens, opp

    @jax.jit
    def step(key, state, ts, action):
        done = ts.terminated | ts.truncated
        new = jax.vmap(env.step)(jax.random.split(key, b), state, action)
        state, ts = where_done(done, (state, ts), new)
        return state, ts, new[1].reward

    return {"reset": reset, "sample": sample, "step": step}
