"""JoyAgents' multi-agent system as one jitted transform: a master routes, sub-agents act, a tool runs,
the master answers.

    cfg = SystemConfig(request_tokens=11, step_tokens=6, answer_tokens=2)
    out = run_system(graphdef, states, req, hints, key, config=cfg)               # greedy
    out.answer [B, A], out.answer_lens [B], out.route [B] (route index, -1 = invalid), out.record (NodeRecord)
    out = run_system(..., temperature=1.0, start=k, fixed=record)   # resample from node k on, prefix fixed
    out = run_system(..., temperature=1.0, start=k, fixed=record, continuation_temperature=0.0)  # greedy after k

Agents: 0 master, 1 math, 2 QA, 3 function call. Each is an LM policy: one LM with role prompts
(``states`` a 1-tuple, the default) or one LM per agent (``states`` a 4-tuple of the same graphdef).
A trajectory is four *nodes*, always in this order (static shapes, a node may be inactive):

    node 0  route   master  "<bos>R{hint}:{request}>"   -> route token (m / q / f / t) + <eos>
    node 1  step 1  agent a1 of the route  "<bos>{role}{request};>"          -> output + <eos>
    node 2  step 2  agent a2 (two-step route "t" only) "<bos>{role}{request};{result 1}>" -> output + <eos>
    node 3  final   master  "<bos>F{request};{result}>"  -> answer + <eos>

Routes: m -> math; q -> QA; f -> function call; t -> QA then math (``ROUTE_AGENTS``). Role tokens:
M (math), Q (QA), C (call). The result a step returns is its output, except for the function-call
agent: its output ``name(a,b)`` is executed by the pure-JAX tool (``tasks.assistant.execute_call``)
and the tool's value returns (a malformed call returns "?"). ``{hint}`` is the memory's strategy for
the request type ("?" when the memory has none, or without memory). An invalid route makes steps 1-2
inactive and the trajectory's reward 0. Every node is one call of the KV-cache sampler
(``models.lm.sampler.generate``) for the whole batch: no Python per token or per row.

``start=k`` with ``fixed`` (a NodeRecord of the same batch) replays nodes < k from ``fixed`` (the
prefix stays exactly as sampled) and samples nodes >= k: node-wise Monte Carlo continuations. The
nodes are one ``lax.scan`` and ``start`` is a traced value, so the sampler compiles once for every
node and every ``start``.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp

from jaxrl_reason.agents.memagent.agent import build_prompt, parse_template
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.tasks.assistant import ROUTES, check_answers, encode_int, execute_call
from jaxrl_reason.tasks.vocab import VOCAB
from jaxrl_reason.utils.validation import check_hyperparameters

AGENTS = ("master", "math", "qa", "call")
MASTER, MATH, QA, CALL = range(4)
NODES = ("route", "step1", "step2", "final")
NUM_NODES = len(NODES)
ROUTE_AGENTS = ((MATH, -1), (QA, -1), (CALL, -1), (QA, MATH))  # per route index (ROUTES order)
ROLE_CHARS = "RMQC"  # role token of each agent at a step node (R: master's route node); final node: F
NO_HINT = "?"
_tok = lambda c: VOCAB.encode(c)[0]
ROUTE_TOKENS = tuple(_tok(r) for r in ROUTES)
_ERROR = _tok("?")


@dataclasses.dataclass(frozen=True)
class SystemConfig:
    """Static shapes and templates (hashable: a jit static argument)."""

    request_tokens: int = 11  # R
    step_tokens: int = 6  # a sub-agent's output (content, without <eos>)
    answer_tokens: int = 2  # the final answer (content)
    shared: bool = True  # one LM with role prompts; False: one LM per agent
    route_template: str = "R{hint}:{request}>"
    step_template: str = "{role}{request};{prev}>"
    final_template: str = "F{request};{prev}>"

    def __post_init__(self):
        check_hyperparameters(self)
        for f in ("request_tokens", "step_tokens", "answer_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"SystemConfig: {f} must be >= 1, got {getattr(self, f)}")
        if self.step_tokens < self.answer_tokens:
            raise ValueError(f"SystemConfig: step_tokens ({self.step_tokens}) must be >= answer_tokens "
                             f"({self.answer_tokens}): a step's result may be the final answer")
        parse_template(self.route_template, ("hint", "request"))
        parse_template(self.step_template, ("role", "request", "prev"))
        parse_template(self.final_template, ("request", "prev"))

    @property
    def num_models(self) -> int:
        return 1 if self.shared else len(AGENTS)

    @property
    def prompt_len(self) -> int:
        """Widest node prompt (with <bos>)."""
        width = {"hint": 1, "request": self.request_tokens, "role": 1, "prev": self.step_tokens}
        lens = [1 + sum(len(x) if k == "lit" else width[x] for k, x in parse_template(t, f))
                for t, f in ((self.route_template, ("hint", "request")), (self.step_template, ("role", "request", "prev")),
                             (self.final_template, ("request", "prev")))]
        return max(lens)

    @property
    def response_len(self) -> int:
        return self.step_tokens + 1

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    def limits(self) -> tuple[int, ...]:
        """Content tokens each node may emit (route: one token)."""
        return (1, self.step_tokens, self.step_tokens, self.answer_tokens)

    def check_model(self, model_cfg) -> None:
        VOCAB.check_model(model_cfg, self.seq_len, "SystemConfig")


@flax.struct.dataclass
class Requests:
    """text [B, R] (right-padded), text_lens [B], answer [B, A'], answer_lens [B], kind [B] (request type)."""

    text: jax.Array
    text_lens: jax.Array
    answer: jax.Array
    answer_lens: jax.Array
    kind: jax.Array

    def __len__(self) -> int:
        return self.text.shape[0]

    def repeat(self, g: int) -> "Requests":
        """Each request ``g`` times in a row ([B] -> [B*g], group-major)."""
        return jax.tree.map(lambda x: jnp.repeat(x, g, axis=0), self)


@flax.struct.dataclass
class NodeRecord:
    """Every node of every trajectory, stacked over the 4 nodes: prompts [4, B, P], prompt_lens [4, B],
    tokens [4, B, T] (sampled response incl. <eos>, pad after), lengths [4, B], active [4, B] bool,
    agent [4, B] int32 (which agent acted; -1 inactive)."""

    prompts: jax.Array
    prompt_lens: jax.Array
    tokens: jax.Array
    lengths: jax.Array
    active: jax.Array
    agent: jax.Array

    def repeat(self, g: int) -> "NodeRecord":
        return jax.tree.map(lambda x: jnp.repeat(x, g, axis=1), self)


@flax.struct.dataclass
class SystemOutput:
    answer: jax.Array  # [B, A]
    answer_lens: jax.Array  # [B]
    route: jax.Array  # [B] route index into ROUTES, -1 = invalid
    call_valid: jax.Array  # [B] bool: a function-call step emitted a well-formed call
    reward: jax.Array  # [B] float32: exact match of the answer (0 for an invalid route)
    record: NodeRecord


def content(tokens: jax.Array, lengths: jax.Array, limit) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sampled response tokens [B, T] -> (content [B, T-1] before the first <eos>, at most ``limit`` tokens;
    lens [B]; ended [B]: False when no <eos> came within limit+1 tokens, an overlong, malformed output).
    ``limit`` may be traced."""
    w = tokens.shape[1] - 1
    pos = jnp.arange(tokens.shape[1])[None]
    is_eos = (tokens == VOCAB.eos) & (pos < lengths[:, None])
    has = jnp.any(is_eos, axis=1)
    n = jnp.where(has, jnp.argmax(is_eos, axis=1), lengths)
    ended = has & (n <= limit)
    n = jnp.minimum(n, limit)
    out = jnp.where(pos[:, :w] < n[:, None], tokens[:, :w], VOCAB.pad)
    return out, n.astype(jnp.int32), ended


def _sample(graphdef, states, agent, prompts, plens, key, budget, temperature: float, t: int):
    """One node for all rows: rows with budget 0 stay empty; ``agent`` [B] picks the model per row
    (shared weights: one sampler call; separate models: one call per model, rows selected)."""
    cfg = SamplerConfig(max_new_tokens=t, temperature=temperature, pad_id=VOCAB.pad)
    stop = jnp.full((prompts.shape[0], 1), VOCAB.eos, jnp.int32)
    if len(states) == 1:
        out = generate(graphdef, states[0], prompts, plens, key, stop, budget, config=cfg)
        return out.tokens, out.lengths
    toks = jnp.full((prompts.shape[0], t), VOCAB.pad, jnp.int32)
    lens = jnp.zeros((prompts.shape[0],), jnp.int32)
    for i, st in enumerate(states):
        mine = agent == i
        out = generate(graphdef, st, prompts, plens, jax.random.fold_in(key, i), stop, jnp.where(mine, budget, 0),
                       config=cfg)
        toks = jnp.where(mine[:, None], out.tokens, toks)
        lens = jnp.where(mine, out.lengths, lens)
    return toks, lens


def empty_record(b: int, config: SystemConfig) -> NodeRecord:
    """An all-pad NodeRecord [4, B, ...] (the ``fixed`` argument when nothing is replayed)."""
    z = jnp.zeros((NUM_NODES, b), jnp.int32)
    return NodeRecord(prompts=jnp.zeros((NUM_NODES, b, config.prompt_len), jnp.int32), prompt_lens=z,
                      tokens=jnp.zeros((NUM_NODES, b, config.response_len), jnp.int32), lengths=z,
                      active=z.astype(bool), agent=z - 1)


def _step_result(a, out, lens, ended, width: int):
    """What a step returns: its output, or the tool's value for a call ("?" when malformed).
    -> (tokens [B, width], lens [B], well-formed call [B])."""
    value, valid = execute_call(out, lens)
    valid = valid & ended
    v_tok, v_len = encode_int(value, width)
    err_tok = jnp.zeros_like(out).at[:, 0].set(_ERROR)
    is_call = a == CALL
    tok = jnp.where((is_call & valid)[:, None], v_tok, jnp.where(is_call[:, None], err_tok, out))
    return tok, jnp.where(is_call, jnp.where(valid, v_len, 1), lens), is_call & valid


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "temperature", "continuation_temperature"))
def run_system(graphdef, states: tuple, req: Requests, hints: jax.Array, key, *, config: SystemConfig,
               temperature: float = 0.0, start=0, fixed: NodeRecord | None = None,
               continuation_temperature: float | None = None) -> SystemOutput:
    """All four nodes for a batch of requests; hints [B] (a route token or the "?" token). See the module
    docstring. ``start`` (int, may be traced) > 0 needs ``fixed``; nodes < start are replayed from it.
    ``continuation_temperature`` (None: ``temperature``) is the temperature of the nodes after ``start``
    (0: the continuation is the current policy's greedy one, as at evaluation).

    The nodes run in one ``lax.scan`` (one compiled sampler for all of them): the node index selects the
    prompt, the acting agent and the token limit; replayed nodes get a zero budget (no decoding)."""
    if isinstance(start, int) and not 0 <= start < NUM_NODES:
        raise ValueError(f"start must be in [0, {NUM_NODES}), got {start}")
    if fixed is None and not (isinstance(start, int) and start == 0):
        raise ValueError("start > 0 (node-wise resampling) needs the fixed prefix record")
    if len(states) != config.num_models:
        raise ValueError(f"config.shared={config.shared} needs {config.num_models} model state(s), got {len(states)}")
    if req.text.shape[1] > config.request_tokens:
        raise ValueError(f"requests are {req.text.shape[1]} tokens wide > request_tokens {config.request_tokens}")
    b = len(req)
    fixed = empty_record(b, config) if fixed is None else fixed
    p, t, w = config.prompt_len, config.response_len, config.step_tokens
    request = (req.text, req.text_lens)
    ones = jnp.ones((b,), jnp.int32)
    hint = (hints[:, None].astype(jnp.int32), ones)
    empty = (jnp.zeros((b, 1), jnp.int32), jnp.zeros((b,), jnp.int32))
    roles = jnp.asarray([_tok(c) for c in ROLE_CHARS], jnp.int32)
    role = lambda a: (roles[jnp.maximum(a, 0)][:, None], ones)
    table = jnp.asarray(ROUTE_AGENTS, jnp.int32)
    limits = jnp.asarray(config.limits(), jnp.int32)
    master = jnp.full((b,), MASTER, jnp.int32)
    everyone = jnp.ones((b,), bool)
    step_fields = ("role", "request", "prev")

    def node(carry, n):
        route, res1, res1_len, res, res_len, call1 = carry
        a1 = jnp.where(route >= 0, table[jnp.maximum(route, 0), 0], -1)
        a2 = jnp.where(route >= 0, table[jnp.maximum(route, 0), 1], -1)
        built = [build_prompt(config.route_template, ("hint", "request"), {"hint": hint, "request": request}, p),
                 build_prompt(config.step_template, step_fields, {"role": role(a1), "request": request, "prev": empty}, p),
                 build_prompt(config.step_template, step_fields,
                              {"role": role(a2), "request": request, "prev": (res1, res1_len)}, p),
                 build_prompt(config.final_template, ("request", "prev"), {"request": request, "prev": (res, res_len)}, p)]
        prompts = jnp.stack([x[0] for x in built])[n]
        plens = jnp.stack([x[1] for x in built])[n]
        agent = jnp.stack([master, a1, a2, master])[n]
        active = jnp.stack([everyone, a1 >= 0, a2 >= 0, everyone])[n]
        limit = limits[n]
        sampled = n >= start
        budget = jnp.where(active & sampled, limit + 1, 0)
        model_of = jnp.zeros_like(agent) if config.shared else jnp.maximum(agent, 0)
        sample = lambda temp: _sample(graphdef, states, model_of, prompts, plens, jax.random.fold_in(key, n), budget,
                                      temp, t)
        if continuation_temperature is None or continuation_temperature == temperature:
            toks, lens = sample(temperature)
        else:
            toks, lens = jax.lax.cond(n > start, lambda: sample(continuation_temperature), lambda: sample(temperature))
        toks = jnp.where(sampled, toks, fixed.tokens[n])
        lens = jnp.where(sampled, lens, fixed.lengths[n])
        out, olen, ended = content(toks, lens, limit)
        hit = out[:, :1] == jnp.asarray(ROUTE_TOKENS)[None]
        new_route = jnp.where(ended & (olen == 1) & jnp.any(hit, 1), jnp.argmax(hit, 1), -1).astype(jnp.int32)
        r_tok, r_len, r_call = _step_result(agent, out, olen, ended, w)
        route = jnp.where(n == 0, new_route, route)
        res1, res1_len = jnp.where(n == 1, r_tok, res1), jnp.where(n == 1, r_len, res1_len)
        take = (n == 1) | ((n == 2) & (a2 >= 0))
        res, res_len = jnp.where(take[:, None], r_tok, res), jnp.where(take, r_len, res_len)
        call1 = jnp.where(n == 1, r_call, call1)
        rec = (prompts, plens, toks, lens, active, jnp.where(active, agent, -1), out, olen, ended)
        return (route, res1, res1_len, res, res_len, call1), rec

    zeros_tok, zeros_len = jnp.zeros((b, w), jnp.int32), jnp.zeros((b,), jnp.int32)
    init = (jnp.full((b,), -1, jnp.int32), zeros_tok, zeros_len, zeros_tok, zeros_len, jnp.zeros((b,), bool))
    (route, *_, call1), recs = jax.lax.scan(node, init, jnp.arange(NUM_NODES))
    prompts, plens, toks, lens, active, agent, out, olen, ended = recs
    ans, ans_len, ans_ok = out[3][:, :config.answer_tokens], olen[3], ended[3]
    reward = check_answers(ans, ans_len, req.answer, req.answer_lens) * ((route >= 0) & ans_ok)
    record = NodeRecord(prompts=prompts, prompt_lens=plens, tokens=toks, lengths=lens, active=active, agent=agent)
    return SystemOutput(answer=ans, answer_lens=ans_len, route=route, call_valid=call1, reward=reward, record=record)


def requests_from_arrays(arrays: dict) -> Requests:
    """``tasks.assistant.request_arrays`` output -> Requests (device arrays)."""
    return Requests(**{k: jnp.asarray(v) for k, v in arrays.items()})


__all__ = ["AGENTS", "CALL", "MASTER", "MATH", "NODES", "NO_HINT", "NUM_NODES", "NodeRecord", "QA", "ROLE_CHARS",
           "ROUTE_AGENTS", "ROUTE_TOKENS", "Requests", "SystemConfig", "SystemOutput", "content", "empty_record", "requests_from_arrays",
           "run_system"]
