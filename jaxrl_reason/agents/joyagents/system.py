"""JoyAgents' multi-agent system as one jitted transform: a master routes, sub-agents act, a tool runs,
the master answers.

    cfg = SystemConfig(request_tokens=11, step_tokens=6, answer_tokens=2)
    out = run_system(graphdef, states, req, hints, key, config=cfg)               # greedy
    out.answer [B, A], out.answer_lens [B], out.route [B] (route index, -1 = invalid), out.record (NodeRecord)
    out = run_system(..., temperature=1.0, start=k, fixed=record)   # resample from node k on, prefix fixed

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
prefix stays exactly as sampled) and samples nodes >= k: node-wise Monte Carlo continuations.
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
        if self.seq_len > model_cfg.max_seq_len:
            raise ValueError(f"SystemConfig: a node needs {self.seq_len} tokens > the model's max_seq_len "
                             f"{model_cfg.max_seq_len}")
        if model_cfg.vocab_size < VOCAB.size:
            raise ValueError(f"model vocab_size {model_cfg.vocab_size} < character vocabulary size {VOCAB.size}")


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


def content(tokens: jax.Array, lengths: jax.Array, limit: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sampled response tokens [B, T] -> (content [B, limit] before the first <eos>, lens [B], ended [B]):
    ``ended`` is False when no <eos> came within limit+1 tokens (an overlong, malformed output)."""
    pos = jnp.arange(tokens.shape[1])[None]
    is_eos = (tokens == VOCAB.eos) & (pos < lengths[:, None])
    has = jnp.any(is_eos, axis=1)
    n = jnp.where(has, jnp.argmax(is_eos, axis=1), lengths)
    ended = has & (n <= limit)
    n = jnp.minimum(n, limit)
    out = jnp.where(pos[:, :limit] < n[:, None], tokens[:, :limit], VOCAB.pad)
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
        if i == MASTER and len(states) != len(AGENTS):
            raise ValueError(f"separate models need {len(AGENTS)} states, got {len(states)}")
        out = generate(graphdef, st, prompts, plens, jax.random.fold_in(key, i), stop, jnp.where(mine, budget, 0),
                       config=cfg)
        toks = jnp.where(mine[:, None], out.tokens, toks)
        lens = jnp.where(mine, out.lengths, lens)
    return toks, lens


def _const(b: int, ids) -> tuple[jax.Array, jax.Array]:
    return jnp.broadcast_to(jnp.asarray(ids, jnp.int32), (b, len(ids))), jnp.full((b,), len(ids), jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "temperature", "start"))
def run_system(graphdef, states: tuple, req: Requests, hints: jax.Array, key, *, config: SystemConfig,
               temperature: float = 0.0, start: int = 0, fixed: NodeRecord | None = None) -> SystemOutput:
    """All four nodes for a batch of requests; hints [B] (a route token or the "?" token). See the module
    docstring. ``start`` > 0 needs ``fixed``; nodes < start are replayed from it."""
    if not 0 <= start < NUM_NODES:
        raise ValueError(f"start must be in [0, {NUM_NODES}), got {start}")
    if start > 0 and fixed is None:
        raise ValueError("start > 0 (node-wise resampling) needs the fixed prefix record")
    if len(states) != config.num_models:
        raise ValueError(f"config.shared={config.shared} needs {config.num_models} model state(s), got {len(states)}")
    if req.text.shape[1] > config.request_tokens:
        raise ValueError(f"requests are {req.text.shape[1]} tokens wide > request_tokens {config.request_tokens}")
    b = len(req)
    p, t = config.prompt_len, config.response_len
    keys = jax.random.split(key, NUM_NODES)
    request = (req.text, req.text_lens)
    rec = {k: [] for k in ("prompts", "prompt_lens", "tokens", "lengths", "active", "agent")}
    model_of = (lambda a: jnp.zeros_like(a)) if config.shared else (lambda a: jnp.maximum(a, 0))

    def node(n, template, fields, values, agent, active):
        prompts, plens = build_prompt(template, fields, values, p)
        limit = config.limits()[n]
        if n < start:
            toks, lens = fixed.tokens[n], fixed.lengths[n]
        else:
            budget = jnp.where(active, limit + 1, 0)
            toks, lens = _sample(graphdef, states, model_of(agent), prompts, plens, keys[n], budget, temperature, t)
        for k, v in zip(rec, (prompts, plens, toks, lens, active, jnp.where(active, agent, -1))):
            rec[k].append(v)
        return content(toks, lens, limit)

    everyone = jnp.ones((b,), bool)
    master = jnp.full((b,), MASTER, jnp.int32)
    # node 0: route
    r_out, r_len, r_ok = node(0, config.route_template, ("hint", "request"),
                              {"hint": (hints[:, None].astype(jnp.int32), jnp.ones((b,), jnp.int32)), "request": request},
                              master, everyone)
    hit = r_out[:, :1] == jnp.asarray(ROUTE_TOKENS)[None]
    route = jnp.where(r_ok & (r_len == 1) & jnp.any(hit, 1), jnp.argmax(hit, 1), -1).astype(jnp.int32)
    table = jnp.asarray(ROUTE_AGENTS, jnp.int32)
    a1 = jnp.where(route >= 0, table[route, 0], -1)
    a2 = jnp.where(route >= 0, table[route, 1], -1)
    roles = jnp.asarray([_tok(c) for c in ROLE_CHARS], jnp.int32)
    role = lambda a: (roles[jnp.maximum(a, 0)][:, None], jnp.ones((b,), jnp.int32))
    fields = ("role", "request", "prev")

    def result(a, out, lens, ended):
        """What a step returns: its output, or the tool's value for a call ("?" when malformed)."""
        value, valid = execute_call(out, lens)
        valid = valid & ended
        v_tok, v_len = encode_int(value, config.step_tokens)
        err_tok, err_len = _const(b, [_ERROR])
        err_tok = jnp.pad(err_tok, ((0, 0), (0, config.step_tokens - 1)))
        is_call = a == CALL
        tok = jnp.where((is_call & valid)[:, None], v_tok, jnp.where(is_call[:, None], err_tok, out))
        return tok, jnp.where(is_call, jnp.where(valid, v_len, err_len), lens), is_call & valid

    # node 1: first step
    empty = (jnp.zeros((b, 1), jnp.int32), jnp.zeros((b,), jnp.int32))
    s1, s1_len, s1_ok = node(1, config.step_template, fields, {"role": role(a1), "request": request, "prev": empty},
                             a1, a1 >= 0)
    res1, res1_len, call1 = result(a1, s1, s1_len, s1_ok)
    # node 2: second step (two-step routes)
    s2, s2_len, s2_ok = node(2, config.step_template, fields,
                             {"role": role(a2), "request": request, "prev": (res1, res1_len)}, a2, a2 >= 0)
    res2, res2_len, _ = result(a2, s2, s2_len, s2_ok)
    two = a2 >= 0
    res = jnp.where(two[:, None], res2, res1)
    res_len = jnp.where(two, res2_len, jnp.where(a1 >= 0, res1_len, 0))
    # node 3: final answer
    ans, ans_len, ans_ok = node(3, config.final_template, ("request", "prev"), {"request": request, "prev": (res, res_len)},
                                master, everyone)
    reward = check_answers(ans, ans_len, req.answer, req.answer_lens) * ((route >= 0) & ans_ok)
    record = NodeRecord(**{k: jnp.stack(v) for k, v in rec.items()})
    return SystemOutput(answer=ans, answer_lens=ans_len, route=route, call_valid=call1, reward=reward, record=record)


def requests_from_arrays(arrays: dict) -> Requests:
    """``tasks.assistant.request_arrays`` output -> Requests (device arrays)."""
    return Requests(**{k: jnp.asarray(v) for k, v in arrays.items()})


__all__ = ["AGENTS", "CALL", "MASTER", "MATH", "NODES", "NO_HINT", "NUM_NODES", "NodeRecord", "QA", "ROLE_CHARS",
           "ROUTE_AGENTS", "ROUTE_TOKENS", "Requests", "SystemConfig", "SystemOutput", "content", "requests_from_arrays",
           "run_system"]
