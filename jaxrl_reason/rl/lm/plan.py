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

FLOPs per step are analytic (2 x matmul params x tokens per forward, plus attention; the update's backward
twice its forward, a "block" remat one forward more): XLA's ``cost_analysis()`` counts a loop body once
(the layer scan, the decode loop), so its figure (``flops_xla``) is a lower bound only. The step time
estimate is flops / ``flops_per_s`` (default: a short matmul on the device, or a table for accelerators).
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

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
    flops: dict  # name -> analytic FLOPs per step
    flops_per_s: float

    @property
    def resident(self) -> int:
        return self.params + self.rest + self.optimizer_state + self.reference

    @property
    def activations(self) -> int:
        return self.programs["update"].temp

    @property
    def peak(self) -> int:
        return self.resident + max(p.working for p in self.programs.values())

    @property
    def step_flops(self) -> float:
        return float(sum(self.flops.values()))

    @property
    def step_time_s(self) -> float:
        return self.step_flops / self.flops_per_s

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
        for name, p in self.programs.items():
            lines.append(f"  program {name:<8} temp {gib(p.temp)}  working {gib(p.working)}  "
                         f"flops {self.flops.get(name, 0):.3g}")
        lines.append(f"  flops / step     {self.step_flops:.3g}   est. step time {self.step_time_s:.3g} s "
                     f"(at {self.flops_per_s:.3g} flop/s)")
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
    """Matmul throughput of ``device`` (float32, best of a few runs): the CPU's estimate."""
    device = device or jax.devices()[0]
    for kind, peak in PEAK_FLOPS.items():
        if kind in getattr(device, "device_kind", ""):
            return 0.4 * peak  # a typical model FLOPs utilisation
    x = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


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


def _abstract_state(learner, agent):
    key = jax.random.key(0)
    return jax.eval_shape(lambda p, r: learner.new_state(p, r, key, agent), learner._params, learner._rest)


def _plan(learner, state, programs: dict, flops: dict, kv: int, device_memory_bytes, flops_per_s) -> Plan:
    dev = jax.devices()[0]
    return Plan(device=f"{dev.platform}:{getattr(dev, 'device_kind', '')}",
                device_memory=device_memory(dev) if device_memory_bytes is None else device_memory_bytes,
                params=_bytes(state.params), rest=_bytes(state.rest), optimizer_state=_bytes(state.opt_state),
                reference=_bytes(state.ref_params), kv_cache=kv, programs=programs, flops=flops,
                flops_per_s=flops_per_s or measured_flops_per_s(dev))


def plan_step(learner, agent, batch=None, *, device_memory_bytes: int | None = None,
              flops_per_s: float | None = None) -> Plan:
    """A pure agent's plan: its one jitted step program (rollout + update) compiled for ``batch`` (single
    process; per device with a mesh). Its FLOPs are XLA's count (loop bodies once: a lower bound)."""
    if getattr(agent, "host", False):
        raise ValueError("plan_step: a host agent's rollout is not one program; give it a plan(learner) of its own")
    state = _abstract_state(learner, agent)
    compiled = learner._program("step", agent).lower(state, batch, jax.ShapeDtypeStruct((), jnp.int32)).compile()
    update = ProgramPlan.of(compiled, _bytes(state))
    return _plan(learner, state, {"update": update}, {"update": update.flops_xla}, 0, device_memory_bytes,
                 flops_per_s)


def plan_grpo(learner, agent, *, device_memory_bytes: int | None = None, flops_per_s: float | None = None) -> Plan:
    """Compile GRPO's (``rl.grpo.GRPOAgent`` on ``learner``) sampling, log-prob and update programs for its shapes,
    without running them, and return their ``Plan`` (single process; per device with a mesh)."""
    from jaxrl_reason.models.lm.sampler import generate
    from jaxrl_reason.rl.lm.rollout import Rollout

    cfg, lcfg = agent.config, learner.config
    state = _abstract_state(learner, agent)
    b, p, n = cfg.groups_sampled * cfg.group_size, agent.prompt_len, cfg.max_new_tokens
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    model_state = jax.eval_shape(learner.policy, state)
    stops = i32(b, *np.shape(agent.stop_tokens))
    seqs = None if agent.stop_sequences is None else i32(b, *np.shape(agent.stop_sequences))
    sample = generate.lower(learner.graphdef, model_state, i32(b, p), i32(b), key, stops, i32(b), seqs,
                            config=agent.sampler_config).compile()
    params_b, rest_b = _bytes(state.params), _bytes(state.rest)
    programs = {"sample": ProgramPlan.of(sample, params_b + rest_b)}
    rows = Rollout(i32(b, p + n), i32(b), f32(b, n), sample_logp=f32(b, n), num_groups=cfg.groups_sampled,
                   keep=cfg.prompts_per_step)
    passes, logps = learner._program("passes", agent), {}
    if passes is not None:
        programs["logprobs"] = ProgramPlan.of(passes.lower(state, rows).compile(), _bytes(state))
        logps = jax.eval_shape(passes, state, rows)
    scored = rows.replace(rewards=f32(b), valid=f32(b))
    update = learner._program("update", agent).lower(state, scored, logps, key, i32()).compile()
    programs["update"] = ProgramPlan.of(update, _bytes(state))

    model_cfg = nnx.merge(learner.graphdef, learner._params, learner._rest).cfg
    from jaxrl_reason.models.lm.model import init_cache

    kv = _bytes(jax.eval_shape(lambda: init_cache(model_cfg, b, p + n)))
    embed = model_cfg.vocab_size * model_cfg.d_model  # a lookup, not a matmul (unless it is the tied head)
    matmul = _count(learner._params) + _count(learner._rest) - (0 if model_cfg.tie_embeddings else embed)
    rows_trained = cfg.prompts_per_step * cfg.group_size
    fwd = logp_flops(model_cfg, matmul, rows_trained, p, n, cfg.prompt_group)
    passes_n = 3 + (cfg.remat == "block")  # forward + backward (2 x), + the blocks' recomputation
    flops = {"sample": forward_flops(model_cfg, matmul, b, p + n, p + n), "update": passes_n * fwd * cfg.epochs}
    if passes is not None:
        flops["logprobs"] = logp_flops(model_cfg, matmul, b, p, n, cfg.prompt_group) * (lcfg.needs_old_pass()
                                                                                        + lcfg.needs_ref)
    return _plan(learner, state, programs, flops, kv, device_memory_bytes, flops_per_s)


def _count(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)))


__all__ = ["ADVICE", "Plan", "PlanError", "ProgramPlan", "device_memory", "forward_flops", "measured_flops_per_s",
           "plan_grpo", "plan_step"]
