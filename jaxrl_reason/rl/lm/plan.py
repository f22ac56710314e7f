"""Know before you launch: compile a learner's programs for an agent's shapes without running them and report,
per device, what its memory holds and what a step costs; refuse a plan that does not fit.

    p = learner.plan(agent, batch)          # the agent's own plan (GRPO's: plan_grpo), else plan_step
    print(p.summary())
    p.check()                               # PlanError (one line: the largest term and what to change)
    p = plan_grpo(learner, agent, device_memory_bytes=8 << 30, flops_per_s=50e12)

Nothing is allocated: the state is abstract (``jax.eval_shape`` of ``learner.new_state``) and each program
(GRPO: sampling, the old / reference log-prob pass where one is needed, the update; a pure agent: its one step
program, whose FLOPs are XLA's count) is lowered and compiled
(``jit(...).lower(...).compile()``); ``memory_analysis()`` gives its arguments, outputs, donated aliases and
temporaries. Memory terms (bytes per device):

    params, rest, optimizer_state, reference     the state, resident across the step
    kv_cache                                     the sampler's cache (part of the sampling program's temp)
    activations                                  the update's temporaries (what minibatches / remat shrink)
    peak = resident state + the largest program's working memory (its temp + outputs not aliased to
           inputs + inputs that are not the state)

FLOPs per step are analytic and count useful work, what the tokens need (2 x matmul params x tokens per forward,
plus causal attention; sampling: each group's prompt once, the LM head only where a token is drawn; the update's
backward twice its forward); what a program executes beyond them is ``recomputed`` (a "block" remat's second
forward), counted in its time estimate, not in its FLOPs. XLA's ``cost_analysis()`` counts a loop body once
(the layer scan, the decode loop), so its figure (``flops_xla``) is a lower bound only. Bytes per step are the
least memory traffic: the weights once per forward / backward pass and per decode step, the KV cache read at every
decode step, the optimiser reading and writing its state (activations not counted). A program's time estimate is
its roofline, max((flops + recomputed) / ``flops_per_s``, bytes / ``bandwidth``) (defaults: measured on the device by
``measured_flops_per_s`` / ``measured_bandwidth``, or a table for accelerators).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.utils import roofline

GIB = float(1 << 30)

#: what to change when a term is the largest one of a plan that does not fit
ADVICE = {
    "activations": "more minibatches (GRPOConfig.minibatches), remat='block' or 'dots', or fewer max_new_tokens",
    "kv_cache": "fewer rows per step (prompts_per_step x group_size) or fewer max_new_tokens",
    "optimizer_state": "train LoRA adapters (lora / --lora-rank): Adam's moments then cover the adapters only",
    "reference": "no KL term (kl_coef=0, log_kl=False) drops the reference copy; with LoRA it is the base model",
    "params": "a smaller model, bf16 parameters, or shard it over more devices (mesh)",
    "rest": "a smaller model or shard it over more devices (mesh)",
}


class PlanError(ValueError):
    """The plan does not fit the device memory (one line: the largest term, and what to change)."""


def _bytes(tree) -> int:
    def size(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return int(np.prod(x.shape)) * 8  # two uint32 words (threefry)
        return int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize

    return int(sum(size(x) for x in jax.tree.leaves(tree)))


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


class ProgramPlan(NamedTuple):
    """One compiled program's memory (bytes, ``memory_analysis``) and XLA's FLOPs count (loop bodies once)."""

    argument: int
    output: int
    alias: int
    temp: int
    state_arguments: int  # the part of ``argument`` that is resident state
    flops_xla: float

    @property
    def working(self) -> int:
        """Memory the program needs beyond the resident state."""
        return self.temp + self.output - self.alias + self.argument - self.state_arguments

    @classmethod
    def of(cls, compiled, state_arguments: int) -> "ProgramPlan":
        ma = compiled.memory_analysis()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return cls(int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes), int(ma.alias_size_in_bytes),
                   int(ma.temp_size_in_bytes), state_arguments, float((cost or {}).get("flops", 0.0)))


class Plan(NamedTuple):
    device: str
    device_memory: int | None  # bytes; None: unknown
    params: int
    rest: int
    optimizer_state: int
    reference: int
    kv_cache: int
    programs: dict  # name -> ProgramPlan ("sample", "logprobs", "update")
    flops: dict  # name -> analytic FLOPs per step (useful work)
    flops_per_s: float
    bytes: dict = {}  # name -> least bytes moved per step (weights, KV cache, optimiser state)
    bandwidth: float = float("inf")  # bytes/s
    notes: tuple = ()  # lines the summary ends with (e.g. the episode a multi-turn plan is for)
    recomputed: dict = {}  # name -> FLOPs executed beyond the useful ones (remat's recomputed forward)

    @property
    def resident(self) -> int:
        return self.params + self.rest + self.optimizer_state + self.reference

    @property
    def activations(self) -> int:
        return self.programs["update"].temp

    @property
    def peak(self) -> int:
        """Resident state + the largest working memory: a program's, or a host rollout's KV cache (no "sample"
        program: the multi-turn cache lives on the device while the episodes play)."""
        sampling = 0 if "sample" in self.programs else self.kv_cache
        return self.resident + max(sampling, *(p.working for p in self.programs.values()))

    @property
    def step_flops(self) -> float:
        return float(sum(self.flops.values()))

    def time_s(self, name: str) -> float:
        """Program ``name``'s roofline estimate: compute- or bandwidth-bound, whichever is slower."""
        executed = self.flops.get(name, 0.0) + self.recomputed.get(name, 0.0)
        return roofline.roofline_s(executed, self.bytes.get(name, 0.0), self.flops_per_s, self.bandwidth)

    @property
    def step_time_s(self) -> float:
        return float(sum(self.time_s(name) for name in set(self.flops) | set(self.bytes)))

    def terms(self) -> dict:
        """The memory terms (bytes) the check names."""
        return {"params": self.params, "rest": self.rest, "optimizer_state": self.optimizer_state,
                "reference": self.reference, "kv_cache": self.kv_cache, "activations": self.activations}

    def summary(self) -> str:
        gib = lambda b: f"{b / GIB:8.3f} GiB"
        mem = "unknown" if self.device_memory is None else gib(self.device_memory).strip()
        lines = [f"plan on {self.device} (per device; memory {mem})"]
        lines += [f"  {k:<16} {gib(v)}" for k, v in self.terms().items()]
        lines.append(f"  {'peak':<16} {gib(self.peak)}")
        for name in {**self.programs, **self.flops}:
            p = self.programs.get(name)
            bound = "" if name not in self.bytes else (
                "  bandwidth-bound" if self.bytes[name] / self.bandwidth > self.flops.get(name, 0) / self.flops_per_s
                else "  compute-bound")
            mem = (f"temp {gib(p.temp)}  working {gib(p.working)}" if p is not None
                   else f"{'(host loop, not compiled here)':<44}")
            extra = f" (+{self.recomputed[name]:.3g} recomputed)" if self.recomputed.get(name) else ""
            lines.append(f"  program {name:<8} {mem}  flops {self.flops.get(name, 0):.3g}{extra}  "
                         f"bytes {self.bytes.get(name, 0):.3g}  est. {self.time_s(name):.3g} s{bound}")
        lines.append(f"  flops / step     {self.step_flops:.3g}   bytes / step {sum(self.bytes.values()):.3g}   "
                     f"est. step time {self.step_time_s:.3g} s (at {self.flops_per_s:.3g} flop/s, "
                     f"{self.bandwidth:.3g} B/s)")
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)

    def check(self, device_memory: int | None = None) -> "Plan":
        """Raise ``PlanError`` when the peak exceeds the device memory (``device_memory`` or the plan's)."""
        limit = self.device_memory if device_memory is None else device_memory
        if limit is not None and self.peak > limit:
            name, size = max(self.terms().items(), key=lambda kv: kv[1])
            raise PlanError(f"plan: peak {self.peak / GIB:.2f} GiB per device > {limit / GIB:.2f} GiB on {self.device}; "
                            f"the largest term is {name} ({size / GIB:.2f} GiB): {ADVICE[name]}")
        return self


def device_memory(device=None) -> int | None:
    """Bytes of memory of ``device`` (an accelerator's limit; the host's RAM for a CPU), None if unknown."""
    device = device or jax.devices()[0]
    stats = getattr(device, "memory_stats", lambda: None)()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


#: dense bf16 peak FLOP/s of accelerators the estimate knows (device_kind substrings)
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "TPU v5p": 459e12, "TPU v5": 197e12, "TPU v4": 275e12}


def measured_flops_per_s(device=None, n: int = 512) -> float:
    """Matmul throughput of ``device`` (float32 [n, n] @ [n, n], best of a few runs): the CPU's estimate; an
    accelerator's from the table at a typical model FLOPs utilisation (40%)."""
    device = device or jax.devices()[0]
    for kind, peak in PEAK_FLOPS.items():
        if kind in getattr(device, "device_kind", ""):
            return 0.4 * peak
    return roofline.matmul_flops_per_s(n, n, n, "float32", device, repeats=3)


#: memory bandwidth (bytes/s) of accelerators the estimate knows (device_kind substrings)
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "TPU v5p": 2.76e12, "TPU v5": 0.82e12,
                  "TPU v4": 1.2e12}


@functools.lru_cache(maxsize=None)
def measured_bandwidth(device=None) -> float:
    """Memory bandwidth of ``device`` (bytes/s; ``utils.roofline.read_bandwidth``): the CPU's estimate; an
    accelerator's from the table at 80%."""
    device = device or jax.devices()[0]
    for kind, peak in PEAK_BANDWIDTH.items():
        if kind in getattr(device, "device_kind", ""):
            return 0.8 * peak
    return roofline.read_bandwidth(device=device)


def forward_flops(model_cfg, matmul_params: int, rows: int, tokens: int, context: int) -> float:
    """2 x matmul params per token, plus attention (QK^T and AV over ``context`` keys), for ``rows`` x ``tokens``."""
    heads = model_cfg.n_heads * (model_cfg.head_dim or model_cfg.d_model // model_cfg.n_heads)
    return float(rows * tokens * (2 * matmul_params + 4 * model_cfg.n_layers * context * heads))


def logp_flops(model_cfg, matmul_params: int, rows: int, prompt: int, new: int, group: int = 1) -> float:
    """One learner forward pass (``rl.lm.logp``) over ``rows`` sequences of ``prompt`` + ``new`` tokens: the blocks
    on every position but the last (``group`` > 1: each group's prompt once, then the rows' responses), the LM head
    on the ``new`` response positions only."""
    head = model_cfg.vocab_size * model_cfg.d_model
    body = forward_flops(model_cfg, matmul_params - head, 1, 1, 0)  # per token, without attention
    attn = lambda r, t, ctx: forward_flops(model_cfg, 0, r, t, ctx)
    if group > 1:
        blocks = (rows // group) * prompt * body + attn(rows // group, prompt, prompt)
        blocks += rows * (new - 1) * body + attn(rows, new - 1, prompt + new)
    else:
        blocks = rows * (prompt + new - 1) * body + attn(rows, prompt + new - 1, prompt + new)
    return float(blocks + rows * new * 2 * head)


def sample_flops(model_cfg, matmul_params: int, groups: int, group: int, prompt: int, new: int) -> float:
    """Useful FLOPs of sampling ``groups`` x ``group`` rows of ``new`` tokens after a ``prompt``-token prompt each
    group shares (``generate(..., group=)``): the prompt's blocks once per group, causal attention, the LM head at
    its last position; then every row's ``new`` decode steps (blocks + head), each attending to the tokens so far."""
    head = model_cfg.vocab_size * model_cfg.d_model
    body = forward_flops(model_cfg, matmul_params - head, 1, 1, 0)  # per token, without attention
    attn = lambda r, t, ctx: forward_flops(model_cfg, 0, r, t, ctx)
    prefill = groups * prompt * body + attn(groups, prompt, (prompt + 1) / 2) + groups * 2 * head
    rows = groups * group
    decode = rows * new * (body + 2 * head) + attn(rows, new, prompt + (new + 1) / 2)
    return float(prefill + decode)


def sample_bytes(weight_bytes: int, kv_bytes_per_token: float, groups: int, group: int, prompt: int,
                 new: int) -> float:
    """Least bytes moved by that sampling: the weights once for the prefill and once per decode step, the prompts'
    cache written once, each decode step reading every row's cache so far."""
    rows = groups * group
    return float(weight_bytes * (1 + new) + kv_bytes_per_token * (groups * prompt + rows * new * (prompt + new / 2)))


def update_bytes(weight_bytes: int, opt_bytes: int, trainable_bytes: int, passes: float, steps: int) -> float:
    """Least bytes moved by ``steps`` optimiser steps of ``passes`` forward-equivalent passes each: the weights once
    a pass, the optimiser reading and writing its state and the trainable parameters, reading their gradients."""
    return float(steps * (passes * weight_bytes + 2 * opt_bytes + 3 * trainable_bytes))


def _abstract_state(learner, agent):
    key = jax.random.key(0)
    return jax.eval_shape(lambda p, r: learner.new_state(p, r, key, agent), learner._params, learner._rest)


def _plan(learner, state, programs: dict, flops: dict, moved: dict, kv: int, device_memory_bytes, flops_per_s,
          bandwidth, notes: tuple = (), recomputed: dict | None = None) -> Plan:
    dev = jax.devices()[0]
    return Plan(device=f"{dev.platform}:{getattr(dev, 'device_kind', '')}",
                device_memory=device_memory(dev) if device_memory_bytes is None else device_memory_bytes,
                params=_bytes(state.params), rest=_bytes(state.rest), optimizer_state=_bytes(state.opt_state),
                reference=_bytes(state.ref_params), kv_cache=kv, programs=programs, flops=flops,
                flops_per_s=flops_per_s or measured_flops_per_s(dev), bytes=moved,
                bandwidth=bandwidth or (measured_bandwidth(dev) if moved else float("inf")), notes=notes,
                recomputed=recomputed or {})


def plan_step(learner, agent, batch=None, *, device_memory_bytes: int | None = None,
              flops_per_s: float | None = None, bandwidth: float | None = None) -> Plan:
    """A pure agent's plan: its one jitted step program (rollout + update) compiled for ``batch`` (single
    process; per device with a mesh). Its FLOPs are XLA's count (loop bodies once: a lower bound)."""
    if getattr(agent, "host", False):
        raise ValueError("plan_step: a host agent's rollout is not one program; give it a plan(learner) of its own")
    state = _abstract_state(learner, agent)
    compiled = learner._program("step", agent).lower(state, batch, jax.ShapeDtypeStruct((), jnp.int32)).compile()
    update = ProgramPlan.of(compiled, _bytes(state))
    return _plan(learner, state, {"update": update}, {"update": update.flops_xla}, {}, 0, device_memory_bytes,
                 flops_per_s, bandwidth)


def plan_grpo(learner, agent, *, device_memory_bytes: int | None = None, flops_per_s: float | None = None,
              bandwidth: float | None = None) -> Plan:
    """Compile GRPO's (``rl.grpo.GRPOAgent`` on ``learner``) sampling, log-prob and update programs for its shapes,
    without running them, and return their ``Plan`` (single process; per device with a mesh)."""
    from jaxrl_reason.models.lm.model import init_cache
    from jaxrl_reason.models.lm.sampler import generate
    from jaxrl_reason.rl.lm.rollout import Rollout

    cfg = agent.config
    state = _abstract_state(learner, agent)
    b, p, n = cfg.groups_sampled * cfg.group_size, agent.prompt_len, cfg.max_new_tokens
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    model_state = jax.eval_shape(learner.policy, state)
    stops = i32(b, *np.shape(agent.stop_tokens))
    seqs = None if agent.stop_sequences is None else i32(b, *np.shape(agent.stop_sequences))
    sample = generate.lower(learner.graphdef, model_state, i32(b, p), i32(b), key, stops, i32(b), seqs,
                            config=agent.sampler_config, group=cfg.group_size).compile()
    params_b, rest_b = _bytes(state.params), _bytes(state.rest)
    programs = {"sample": ProgramPlan.of(sample, params_b + rest_b)}
    rows = Rollout(i32(b, p + n), i32(b), f32(b, n), sample_logp=f32(b, n), num_groups=cfg.groups_sampled,
                   keep=cfg.prompts_per_step)
    programs.update(_update_programs(learner, agent, state, rows))

    model_cfg, matmul = _matmul_params(learner)
    kv = _bytes(jax.eval_shape(lambda: init_cache(model_cfg, b, p + n)))
    weights = params_b + rest_b
    trained = logp_flops(model_cfg, matmul, cfg.prompts_per_step * cfg.group_size, p, n, cfg.prompt_group)
    flops, moved, recomputed = _learner_costs(learner, state, programs, trained,
                                              logp_flops(model_cfg, matmul, b, p, n, cfg.prompt_group))
    groups = cfg.groups_sampled
    flops["sample"] = sample_flops(model_cfg, matmul, groups, cfg.group_size, p, n)
    moved["sample"] = sample_bytes(weights, kv / (b * (p + n)), groups, cfg.group_size, p, n)
    return _plan(learner, state, programs, flops, moved, kv, device_memory_bytes, flops_per_s, bandwidth,
                 recomputed=recomputed)


def _update_programs(learner, agent, state, rows) -> dict:
    """The learner's log-prob passes (where its config needs them) and update, compiled for the abstract rollout
    ``rows`` (its rewards and valid added): {"logprobs"?, "update"} -> ProgramPlan."""
    b = rows.seqs.shape[0]
    f32 = jax.ShapeDtypeStruct((b,), jnp.float32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    passes, logps, programs = learner._program("passes", agent), {}, {}
    if passes is not None:
        programs["logprobs"] = ProgramPlan.of(passes.lower(state, rows).compile(), _bytes(state))
        logps = jax.eval_shape(passes, state, rows)
    scored = rows.replace(rewards=f32, valid=f32)
    update = learner._program("update", agent).lower(state, scored, logps, key,
                                                     jax.ShapeDtypeStruct((), jnp.int32)).compile()
    programs["update"] = ProgramPlan.of(update, _bytes(state))
    return programs


def _learner_costs(learner, state, programs: dict, trained_fwd: float, rows_fwd: float) -> tuple[dict, dict, dict]:
    """The learner's programs' (flops, bytes, recomputed): the update, forward + backward (3 forward passes of
    ``trained_fwd`` FLOPs) an epoch, a "block" remat's forward more recomputed; the log-prob passes where compiled
    (old policy and / or reference, ``rows_fwd`` each)."""
    cfg = learner.config
    passes = 3 + (cfg.remat == "block")
    weights = _bytes(state.params) + _bytes(state.rest)
    flops = {"update": 3 * trained_fwd * cfg.epochs}
    recomputed = {"update": (passes - 3) * trained_fwd * cfg.epochs}
    moved = {"update": update_bytes(weights, _bytes(state.opt_state), _bytes(state.params), passes,
                                    cfg.epochs * cfg.minibatches)}
    if "logprobs" in programs:
        n_passes = cfg.needs_old_pass() + cfg.needs_ref
        flops["logprobs"], moved["logprobs"] = rows_fwd * n_passes, float(weights * n_passes)
    return flops, moved, recomputed


def _matmul_params(learner) -> tuple:
    """(the model's config, its parameters that multiply: all but the embedding lookup unless it is the tied head)."""
    model_cfg = nnx.merge(learner.graphdef, learner._params, learner._rest).cfg
    embed = model_cfg.vocab_size * model_cfg.d_model
    return model_cfg, _count(learner._params) + _count(learner._rest) - (0 if model_cfg.tie_embeddings else embed)


def episode_flops(model_cfg, matmul_params: int, episodes: int, prompt: int, turns: int, turn_tokens: int,
                  obs_tokens: int) -> float:
    """Useful FLOPs of sampling ``episodes`` multi-turn episodes with the KV cache carried: every token of an episode
    (prompt, T turns of N, T - 1 observations of O) through the blocks once, attending causally to the tokens before
    it; the LM head where a token is drawn (T N per episode)."""
    head = model_cfg.vocab_size * model_cfg.d_model
    body = forward_flops(model_cfg, matmul_params - head, 1, 1, 0)
    tokens = prompt + turns * turn_tokens + (turns - 1) * obs_tokens
    return float(episodes * (tokens * body + turns * turn_tokens * 2 * head)
                 + forward_flops(model_cfg, 0, episodes, tokens, (tokens + 1) / 2))


def episode_roofline_s(model_cfg, matmul_params: int, weight_bytes: int, kv_bytes_per_token: float, episodes: int,
                       prompt: int, turns: int, turn_tokens: int, obs_tokens: int, flops_per_s: float,
                       bytes_per_s: float) -> float:
    """The least seconds ``episodes`` carried multi-turn episodes take here, phase by phase (each waits for the one
    before): the prompts' prefill, each of the T N decode steps and each of the T - 1 observations' prefill, every
    phase reading the weights once and the cache so far, at max(its useful FLOPs / ``flops_per_s``, its bytes /
    ``bytes_per_s``). Its FLOPs add up to `episode_flops`. A decode step is one token per episode: on a CPU it is
    bound by reading the weights."""
    head = model_cfg.vocab_size * model_cfg.d_model
    body = forward_flops(model_cfg, matmul_params - head, 1, 1, 0)
    attn = lambda t, ctx: forward_flops(model_cfg, 0, episodes, t, ctx)
    phase = lambda flops, cached: max(flops / flops_per_s,
                                      (weight_bytes + kv_bytes_per_token * episodes * cached) / bytes_per_s)
    total, held = phase(episodes * (prompt * body + 2 * head) + attn(prompt, (prompt + 1) / 2), prompt), prompt
    for turn in range(turns):
        for step in range(turn_tokens):  # the turn's last token feeds the cache; its logits go unused
            total += phase(episodes * (body + 2 * head * (step < turn_tokens - 1)) + attn(1, held + 1), held)
            held += 1
        if turn < turns - 1:
            total += phase(episodes * (obs_tokens * body + 2 * head) + attn(obs_tokens, held + (obs_tokens + 1) / 2),
                           held)
            held += obs_tokens
    return float(total)


def plan_episodes(learner, agent, prompt: int, turns: int, turn_tokens: int, obs_tokens: int, episodes: int, *,
                  device_memory_bytes: int | None = None, flops_per_s: float | None = None,
                  bandwidth: float | None = None) -> Plan:
    """A multi-turn agent's plan (``rl.lm.multiturn`` with the cache carried): its ``episodes`` episodes' KV cache,
    held on the device for all ``turns`` turns (``episode_cache_len`` slots each: P + T N + (T - 1) O), the update
    compiled for their rollout (rows [episodes, P + L]), sampling's useful FLOPs (``episode_flops``) and least bytes
    (the weights at each of the T N decode steps and T prefills; each decode step reading the cache so far). An
    episode longer than the model's ``max_seq_len`` is refused (ValueError) before anything is compiled."""
    from jaxrl_reason.rl.lm.multiturn import episode_cache_bytes, episode_cache_len, response_width
    from jaxrl_reason.rl.lm.rollout import Rollout

    model_cfg, matmul = _matmul_params(learner)
    slots = episode_cache_len(prompt, turns, turn_tokens, obs_tokens)
    if slots > model_cfg.max_seq_len:
        raise ValueError(f"plan: an episode of {turns} turns holds {slots} tokens (P {prompt} + T N + (T - 1) O), "
                         f"past the model's max_seq_len {model_cfg.max_seq_len}: fewer turns or tokens per turn")
    state = _abstract_state(learner, agent)
    width = response_width(turns, turn_tokens, obs_tokens)
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    rows = Rollout(i32(episodes, prompt + width), i32(episodes), f32(episodes, width), sample_logp=f32(episodes, width),
                   loss_mask=f32(episodes, width), groups=i32(episodes), num_groups=getattr(agent, "num_groups", 1))
    programs = _update_programs(learner, agent, state, rows)
    kv = episode_cache_bytes(model_cfg, episodes, prompt, turns, turn_tokens, obs_tokens)
    weights = _bytes(state.params) + _bytes(state.rest)
    fwd = logp_flops(model_cfg, matmul, episodes, prompt, width)
    flops, moved, recomputed = _learner_costs(learner, state, programs, fwd, fwd)
    flops["sample"] = episode_flops(model_cfg, matmul, episodes, prompt, turns, turn_tokens, obs_tokens)
    decode_steps = turns * turn_tokens  # each reads the weights and, on average, half the episodes' cache
    moved["sample"] = float(weights * (decode_steps + turns) + kv * decode_steps / 2)
    note = (f"episodes: {episodes} x {turns} turns of {turn_tokens} tokens, {obs_tokens}-token observations, "
            f"a {prompt}-token prompt: {slots} cache slots each (max_seq_len {model_cfg.max_seq_len})")
    return _plan(learner, state, programs, flops, moved, kv, device_memory_bytes, flops_per_s, bandwidth, (note,),
                 recomputed=recomputed)


def _count(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)))


__all__ = ["ADVICE", "PEAK_BANDWIDTH", "PEAK_FLOPS", "Plan", "PlanError", "ProgramPlan", "device_memory",
           "episode_flops", "episode_roofline_s", "forward_flops", "logp_flops", "measured_bandwidth",
           "measured_flops_per_s", "plan_episodes", "plan_grpo", "plan_step", "sample_bytes", "sample_flops",
           "update_bytes"]
