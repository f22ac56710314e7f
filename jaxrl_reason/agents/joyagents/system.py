"""JoyAgents' multi-agent system as one jitted transform: a master routes, sub-agents act, a tool runs,
the master answers.

    cfg = SystemConfig(request_tokens=11, step_tokens=6, answer_tokens=2)
    tok = CharTokenizer()                                                         # the presets' tokenizer
    out = run_system(graphdef, states, req, hints, key, config=cfg, tokenizer=tok)   # greedy
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

Token ids come from the tokenizer handed to every entry point (``run_system``, ``SystemConfig.check_model``,
``render``, ...): ``SystemIds.from_tokenizer`` collects them (pad / bos / eos, the route, role and "?"
tokens, the tool's ids) as static Python ints for the jitted code. The system is character-level (the
presets use ``CharTokenizer``): route, role and hint characters and every character of the task's text
must be single tokens, and data text (requests, answers, steps) is spelled one token per character
(``tasks.assistant.spell``; for a byte-level BPE checkpoint tokenizer -- Qwen2/3, Llama 3 -- valid ids
that are not its canonical merged tokenization; other tokenizers are refused with a ValueError naming
the first character that is not one token). Generated ids are read in jit through those per-character
tables only: a multi-character token a checkpoint model emits (a merged "13", "do") is not a route,
digit or answer character, so that output does not parse (invalid route, malformed call, wrong answer).
Template text is our own: it is encoded with special tokens allowed (a checkpoint tokenizer may merge
it: fewer tokens), and counts one token per character in the static prompt width (``prompt_len``).
The pad id may equal the eos id (Qwen2.5 base checkpoints): every length is explicit.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp

from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.models.lm import prompts
from jaxrl_reason.models.lm.prompts import prompt_from_parts, template_parts
from jaxrl_reason.models.lm.sequences import RowBatch, cut_at_eos
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.mesh import split_along
from jaxrl_reason.tasks.assistant import ROUTES, AssistantIds, char_ids, check_answers, encode_int, execute_call
from jaxrl_reason.utils.validation import check_hyperparameters

AGENTS = ("master", "math", "qa", "call")
MASTER, MATH, QA, CALL = range(4)
NODES = ("route", "step1", "step2", "final")
NUM_NODES = len(NODES)
ROUTE_AGENTS = ((MATH, -1), (QA, -1), (CALL, -1), (QA, MATH))  # per route index (ROUTES order)
ROLE_CHARS = "RMQC"  # role token of each agent at a step node (R: master's route node); final node: F
NO_HINT = "?"
ERROR = "?"  # what a malformed call returns
ROUTE_FIELDS, STEP_FIELDS, FINAL_FIELDS = ("hint", "request"), ("role", "request", "prev"), ("request", "prev")


class SystemIds(NamedTuple):
    """The token ids the jitted system needs, from a tokenizer (static Python ints, hashable)."""

    pad: int
    bos: int
    eos: int
    routes: tuple[int, ...]  # the routing token of each route (ROUTES order)
    roles: tuple[int, ...]  # the role token of each agent (ROLE_CHARS)
    no_hint: int  # the hint token when the memory has no strategy (NO_HINT)
    error: int  # the result of a malformed call (ERROR)
    tool: AssistantIds

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> "SystemIds":
        return _system_ids(tokenizer)

    def route_token(self, route: str) -> int:
        return self.routes[ROUTES.index(route)]


@functools.lru_cache(maxsize=32)
def _system_ids(tokenizer: Tokenizer) -> SystemIds:
    one = lambda chars: char_ids(tokenizer, "".join(chars), "SystemIds")
    return SystemIds(pad=tokenizer.pad_id, bos=tokenizer.bos_id, eos=tokenizer.eos_id, routes=one(ROUTES),
                     roles=one(ROLE_CHARS), no_hint=one(NO_HINT)[0], error=one(ERROR)[0],
                     tool=AssistantIds.from_tokenizer(tokenizer))


# the templates' literals must spell back exactly, in at most one token per character (static prompt widths)
parse_template = functools.partial(prompts.parse_template, one_per_char=True)
render = functools.partial(prompts.render, one_per_char=True)  # host-side prompt, as ``build_prompt`` in jit


def build_prompt(parsed: tuple, values: dict, width: int, ids: SystemIds):
    """``parse_template`` output, values {field: (tokens [B, L], lens [B])} -> prompt (tokens [B, width], lens [B]),
    <bos> first. Jittable."""
    return prompt_from_parts(parsed, values, width, bos_id=ids.bos, pad_id=ids.pad)


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
        self.split_templates()

    def split_templates(self) -> tuple:
        """(route, step, final) templates as ``models.lm.prompts.template_parts`` (no tokenizer)."""
        return (template_parts(self.route_template, ROUTE_FIELDS), template_parts(self.step_template, STEP_FIELDS),
                template_parts(self.final_template, FINAL_FIELDS))

    def templates(self, tokenizer: Tokenizer) -> tuple:
        """(route, step, final) templates as ``parse_template`` parts (literal ids of ``tokenizer``)."""
        return (parse_template(self.route_template, ROUTE_FIELDS, tokenizer),
                parse_template(self.step_template, STEP_FIELDS, tokenizer),
                parse_template(self.final_template, FINAL_FIELDS, tokenizer))

    @property
    def num_models(self) -> int:
        return 1 if self.shared else len(AGENTS)

    @property
    def prompt_len(self) -> int:
        """Widest node prompt (with <bos>; template text counts one token per character)."""
        width = {"hint": 1, "request": self.request_tokens, "role": 1, "prev": self.step_tokens}
        return max(1 + sum(len(x) if k == "text" else width[x] for k, x in parts) for parts in self.split_templates())

    @property
    def response_len(self) -> int:
        return self.step_tokens + 1

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    def limits(self) -> tuple[int, ...]:
        """Content tokens each node may emit (route: one token)."""
        return (1, self.step_tokens, self.step_tokens, self.answer_tokens)

    def check_model(self, model_cfg, tokenizer: Tokenizer) -> None:
        """ValueError unless the model (``LMConfig``) holds a node of ``tokenizer``'s ids and the templates and the
        system's tokens are spelled by ``tokenizer``."""
        tokenizer.check_model(model_cfg, self.seq_len, "SystemConfig")
        self.templates(tokenizer)
        SystemIds.from_tokenizer(tokenizer)


@flax.struct.dataclass
class Requests(RowBatch):
    """text [B, R] (right-padded), text_lens [B], answer [B, A'], answer_lens [B], kind [B] (request type)."""

    text: jax.Array
    text_lens: jax.Array
    answer: jax.Array
    answer_lens: jax.Array
    kind: jax.Array


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


def _sample(graphdef, states, agent, prompts, plens, key, budget, temperature: float, t: int, ids: SystemIds):
    """One node for all rows: rows with budget 0 stay empty; ``agent`` [B] picks the model per row
    (shared weights: one sampler call; separate models: one call per model, rows selected)."""
    cfg = SamplerConfig(max_new_tokens=t, temperature=temperature, pad_id=ids.pad)
    stop = jnp.full((prompts.shape[0], 1), ids.eos, jnp.int32)
    if len(states) == 1:
        out = generate(graphdef, states[0], prompts, plens, key, stop, budget, config=cfg)
        return out.tokens, out.lengths
    toks = jnp.full((prompts.shape[0], t), ids.pad, jnp.int32)
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


def _step_result(a, out, lens, ended, width: int, ids: SystemIds):
    """What a step returns: its output, or the tool's value for a call ("?" when malformed).
    -> (tokens [B, width], lens [B], well-formed call [B])."""
    value, valid = execute_call(out, lens, ids.tool)
    valid = valid & ended
    v_tok, v_len = encode_int(value, width, ids.tool)
    err_tok = jnp.full_like(out, ids.pad).at[:, 0].set(ids.error)
    is_call = a == CALL
    tok = jnp.where((is_call & valid)[:, None], v_tok, jnp.where(is_call[:, None], err_tok, out))
    return tok, jnp.where(is_call, jnp.where(valid, v_len, 1), lens), is_call & valid


def run_system(graphdef, states: tuple, req: Requests, hints: jax.Array, key, *, config: SystemConfig,
               tokenizer: Tokenizer, temperature: float = 0.0, start=0, fixed: NodeRecord | None = None,
               continuation_temperature: float | None = None, mesh=None) -> SystemOutput:
    """All four nodes for a batch of requests; hints [B] (a route token or the "?" token of ``tokenizer``).
    ``mesh``: the requests are split over its ``data`` axis (each device runs its slice).
    See the module docstring. ``start`` (int, may be traced) > 0 needs ``fixed``; nodes < start are replayed
    from it. ``continuation_temperature`` (None: ``temperature``) is the temperature of the nodes after
    ``start`` (0: the continuation is the current policy's greedy one, as at evaluation).

    The nodes run in one ``lax.scan`` (one compiled sampler for all of them): the node index selects the
    prompt, the acting agent and the token limit; replayed nodes get a zero budget (no decoding). Jitted
    (the tokenizer's ids and templates are static)."""
    # a plain start=0 without a fixed record stays a Python int (the replay machinery is traced out)
    replay = {} if fixed is None and isinstance(start, int) and start == 0 else {"start": start, "fixed": fixed}
    return _run_system(graphdef, states, req, hints, key, config=config, ids=SystemIds.from_tokenizer(tokenizer),
                       templates=config.templates(tokenizer), temperature=temperature,
                       continuation_temperature=continuation_temperature, mesh=mesh, **replay)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "ids", "templates", "temperature",
                                             "continuation_temperature", "mesh"))
def _run_system(graphdef, states: tuple, req: Requests, hints: jax.Array, key, *, config: SystemConfig,
                ids: SystemIds, templates: tuple, temperature: float = 0.0, start=0, fixed: NodeRecord | None = None,
                continuation_temperature: float | None = None, mesh=None) -> SystemOutput:
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
    req, hints = split_along((req, hints), mesh, 0)
    fixed = split_along(fixed, mesh, 1)  # [4 nodes, B, ...]
    p, t, w = config.prompt_len, config.response_len, config.step_tokens
    request = (req.text, req.text_lens)
    ones = jnp.ones((b,), jnp.int32)
    hint = (hints[:, None].astype(jnp.int32), ones)
    empty = (jnp.zeros((b, 1), jnp.int32), jnp.zeros((b,), jnp.int32))
    roles = jnp.asarray(ids.roles, jnp.int32)
    role = lambda a: (roles[jnp.maximum(a, 0)][:, None], ones)
    table = jnp.asarray(ROUTE_AGENTS, jnp.int32)
    limits = jnp.asarray(config.limits(), jnp.int32)
    master = jnp.full((b,), MASTER, jnp.int32)
    everyone = jnp.ones((b,), bool)
    route_t, step_t, final_t = templates

    def node(carry, n):
        route, res1, res1_len, res, res_len, call1 = split_along(carry, mesh, 0)
        a1 = jnp.where(route >= 0, table[jnp.maximum(route, 0), 0], -1)
        a2 = jnp.where(route >= 0, table[jnp.maximum(route, 0), 1], -1)
        built = [build_prompt(route_t, {"hint": hint, "request": request}, p, ids),
                 build_prompt(step_t, {"role": role(a1), "request": request, "prev": empty}, p, ids),
                 build_prompt(step_t, {"role": role(a2), "request": request, "prev": (res1, res1_len)}, p, ids),
                 build_prompt(final_t, {"request": request, "prev": (res, res_len)}, p, ids)]
        prompts = jnp.stack([x[0] for x in built])[n]
        plens = jnp.stack([x[1] for x in built])[n]
        agent = jnp.stack([master, a1, a2, master])[n]
        active = jnp.stack([everyone, a1 >= 0, a2 >= 0, everyone])[n]
        limit = limits[n]
        sampled = n >= start
        budget = jnp.where(active & sampled, limit + 1, 0)
        model_of = jnp.zeros_like(agent) if config.shared else jnp.maximum(agent, 0)
        sample = lambda temp: _sample(graphdef, states, model_of, prompts, plens, jax.random.fold_in(key, n), budget,
                                      temp, t, ids)
        if continuation_temperature is None or continuation_temperature == temperature:
            toks, lens = sample(temperature)
        else:
            toks, lens = jax.lax.cond(n > start, lambda: sample(continuation_temperature), lambda: sample(temperature))
        toks = jnp.where(sampled, toks, fixed.tokens[n])
        lens = jnp.where(sampled, lens, fixed.lengths[n])
        out, olen, ended = cut_at_eos(toks, lens, limit, ids.eos, ids.pad)
        hit = out[:, :1] == jnp.asarray(ids.routes, jnp.int32)[None]
        new_route = jnp.where(ended & (olen == 1) & jnp.any(hit, 1), jnp.argmax(hit, 1), -1).astype(jnp.int32)
        r_tok, r_len, r_call = _step_result(agent, out, olen, ended, w, ids)
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


__all__ = ["AGENTS", "CALL", "ERROR", "FINAL_FIELDS", "MASTER", "MATH", "NODES", "NO_HINT", "NUM_NODES", "NodeRecord", "QA",
           "ROLE_CHARS", "ROUTE_AGENTS", "ROUTE_FIELDS", "Requests", "STEP_FIELDS", "SystemConfig", "SystemIds",
           "SystemOutput", "build_prompt", "empty_record", "parse_template", "render",
           "requests_from_arrays", "run_system"]
