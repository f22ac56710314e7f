"""rl.lm.plan: a GRPO run's memory and FLOPs from its compiled programs, without running them; the check refuses a
plan over the device memory naming the largest term; the plan's working memory against the measured peak of the
real compiled update (RSS of a subprocess, within 25%), with and without remat."""

import ctypes
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.models.lm.sequences import response_mask
from jaxrl_reason.rl.lm import Rollout
from jaxrl_reason.rl.lm.plan import PlanError, plan_grpo
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig

import testutil

TOK = CharTokenizer()
CFG = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=12, lr=1e-3, reward=RewardConfig("random"))


def _trainer(cfg):
    model = Transformer(LMConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64,
                                 max_seq_len=32), rngs=nnx.Rngs(0))
    return grpo_for_tasks(cfg, model, TOK, [RandomCalculation(max_difficulty=1, ops="+-")], prompt_len=12)


def test_plan_terms_and_the_check():
    tr = _trainer(dataclasses.replace(CFG, loss=LossConfig(kl_coef=0.1)))
    p = plan_grpo(*tr, device_memory_bytes=1 << 40, flops_per_s=1e9, bandwidth=1e15)
    n_params = sum(x.size for x in jax.tree.leaves(tr[0]._params))
    assert p.params == 4 * n_params and p.reference == p.params  # a KL term: the reference copy
    assert 2 * p.params <= p.optimizer_state <= 2 * p.params + 64  # Adam's two moments (+ counters)
    assert set(p.programs) == {"sample", "logprobs", "update"} and p.activations > 0 and p.kv_cache > 0
    assert p.peak >= p.resident + p.programs["update"].working
    assert p.step_time_s == pytest.approx(sum(max(p.flops[k] / 1e9, p.bytes[k] / p.bandwidth) for k in p.flops))
    assert set(p.bytes) == set(p.flops) and p.bytes["sample"] > p.params  # the weights at every decode step
    slow = p._replace(bandwidth=1.0)  # at 1 B/s every program is bandwidth-bound
    assert slow.step_time_s == pytest.approx(sum(p.bytes.values())) and "bandwidth-bound" in slow.summary()
    assert "peak" in p.summary() and "compute-bound" in p.summary() and p.check() is p
    biggest = max(p.terms(), key=p.terms().get)
    with pytest.raises(PlanError, match=rf"^plan: peak .* > 0.00 GiB .*the largest term is {biggest} \(.*\): ") as e:
        p.check(device_memory=1000)
    assert "\n" not in str(e.value)
    # no KL term, one minibatch: neither a reference copy nor a log-prob program
    q = plan_grpo(*_trainer(CFG), device_memory_bytes=1 << 40, flops_per_s=1e9, bandwidth=1e15)
    assert q.reference == 0 and set(q.programs) == {"sample", "update"} and q.step_flops < p.step_flops


@pytest.mark.parametrize("share", [True, False])
def test_update_flops_follow_the_compiled_program(share):
    """The analytic update FLOPs (forward + backward = 3 forward passes) within 35% of XLA's count of the compiled
    update; shared prompts (a 40-token prompt, 4 new tokens) cut both by the same factor."""
    cfg = dataclasses.replace(CFG, max_new_tokens=4, share_prompts=share)
    model = Transformer(LMConfig(vocab_size=TOK.vocab_size, d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=128,
                                 max_seq_len=64, scan_layers=False), rngs=nnx.Rngs(0))  # XLA counts a loop once
    tr = grpo_for_tasks(cfg, model, TOK, [RandomCalculation(max_difficulty=1, ops="+-")], prompt_len=40)
    p = plan_grpo(*tr, device_memory_bytes=1 << 40, flops_per_s=1e9)
    assert p.programs["update"].flops_xla == pytest.approx(p.flops["update"], rel=0.35)
    if share:
        plain = plan_grpo(*_trainer_like(tr, cfg), device_memory_bytes=1 << 40, flops_per_s=1e9)
        assert p.flops["update"] < 0.5 * plain.flops["update"]
        assert p.programs["update"].flops_xla < 0.5 * plain.programs["update"].flops_xla


def test_sample_flops_count_each_group_prompt_once():
    """Sampling's useful FLOPs: a group's prompt once (the prefill of G prompts, not G x group rows), the decode of
    every row; with a long prompt and few new tokens the count is about 1/group of re-prefilling every row."""
    from jaxrl_reason.rl.lm.plan import forward_flops, sample_flops

    model_cfg = LMConfig(vocab_size=TOK.vocab_size, d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=128)
    matmul = 2 * (4 * 64 * 64 + 3 * 64 * 128) + TOK.vocab_size * 64
    shared = sample_flops(model_cfg, matmul, groups=4, group=8, prompt=400, new=1)
    every_row = forward_flops(model_cfg, matmul, 32, 400, 200)
    assert 0.1 < shared / every_row < 0.2
    assert sample_flops(model_cfg, matmul, 4, 8, 40, 16) > sample_flops(model_cfg, matmul, 4, 8, 40, 8)


def test_episode_roofline_adds_up_its_phases():
    """episode_roofline_s: with memory free, the useful FLOPs of the whole episode (`episode_flops`) at the peak; with
    compute free, the weights read once per phase (prompt, T N decode steps, T - 1 observations) plus the cache each
    phase reads; at real rates, no less than either, and growing with T."""
    import math

    from jaxrl_reason.rl.lm.plan import episode_flops, episode_roofline_s

    model_cfg = LMConfig(vocab_size=TOK.vocab_size, d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=128)
    matmul = 2 * (4 * 64 * 64 + 3 * 64 * 128) + TOK.vocab_size * 64
    b, p, t, n, o, w, kv = 8, 32, 4, 16, 16, 10 ** 6, 1000.0
    roof = lambda flops_per_s, bytes_per_s, turns=t: episode_roofline_s(model_cfg, matmul, w, kv, b, p, turns, n, o,
                                                                         flops_per_s, bytes_per_s)
    flops = episode_flops(model_cfg, matmul, b, p, t, n, o)
    assert roof(1e9, math.inf) == pytest.approx(flops / 1e9, rel=1e-9)
    cached = [p] + [p + k * (n + o) + i for k in range(t) for i in range(n)]  # the prompt's phase, then decode
    cached += [p + k * (n + o) + n for k in range(t - 1)]  # each observation's phase
    moved = w * (1 + t * n + t - 1) + kv * b * sum(cached)
    assert roof(math.inf, 1e9) == pytest.approx(moved / 1e9, rel=1e-9)
    assert roof(1e9, 1e9) >= max(flops / 1e9, moved / 1e9) and roof(1e9, 1e9, 8) > roof(1e9, 1e9)


def test_remat_recomputation_is_not_useful_work():
    """A "block" remat executes a second forward: counted in the update's time estimate (``recomputed``), not in
    its FLOPs, which stay those of the same update without remat."""
    plain = plan_grpo(*_trainer(CFG), device_memory_bytes=1 << 40, flops_per_s=1e9, bandwidth=1e15)
    remat = plan_grpo(*_trainer(dataclasses.replace(CFG, remat="block")), device_memory_bytes=1 << 40,
                      flops_per_s=1e9, bandwidth=1e15)
    assert remat.flops == plain.flops and not plain.recomputed.get("update")
    assert remat.recomputed["update"] == pytest.approx(remat.flops["update"] / 3)
    assert remat.time_s("update") == pytest.approx(plain.time_s("update") * 4 / 3)
    assert "recomputed" in remat.summary() and "recomputed" not in plain.summary()


def _trainer_like(tr, cfg):
    model = nnx.merge(tr[0].graphdef, tr[0]._params, tr[0]._rest)
    return grpo_for_tasks(dataclasses.replace(cfg, share_prompts=False), model, TOK,
                                 [RandomCalculation(max_difficulty=1, ops="+-")], prompt_len=40)


@pytest.mark.parametrize("remat", ["none", "block"])
def test_plan_matches_the_measured_peak_of_the_compiled_update(remat):
    env = {**os.environ, "XLA_FLAGS": testutil.subprocess_xla_flags(1), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, remat], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["measured_working"] > 50 << 20  # the program's memory dominates the measurement's noise
    assert abs(r["plan_working"] - r["measured_working"]) <= 0.25 * r["measured_working"], r
    measured_peak = r["resident"] + r["measured_working"]
    assert abs(r["plan_peak"] - measured_peak) <= 0.25 * measured_peak, r

# ---------------------------------------------------------------- run as a script by the test above: plan a small GRPO
# run, then run its compiled update once and measure the resident memory it adds (VmHWM after clear_refs minus VmRSS
# before, glibc's free memory trimmed first); prints one JSON line: the plan's figures and the measurement (bytes)


def status(field: str) -> int:
    """A /proc/self/status field in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def measure_peak(remat: str, d: int = 128, layers: int = 2, rows: int = 32, n: int = 96, p: int = 16):
    tok = CharTokenizer()
    model = Transformer(LMConfig(vocab_size=tok.vocab_size, d_model=d, n_layers=layers, n_heads=4, n_kv_heads=4,
                                 d_ff=4 * d, max_seq_len=p + n), rngs=nnx.Rngs(0))
    cfg = GRPOConfig(prompts_per_step=rows // 4, group_size=4, max_new_tokens=n, reward=RewardConfig("random"),
                     remat=remat)
    learner, agent = grpo_for_tasks(cfg, model, tok, [RandomCalculation(max_difficulty=1, ops="+-")], prompt_len=p)
    plan = plan_grpo(learner, agent, flops_per_s=1e10)
    rollout = Rollout(jnp.ones((rows, p + n), jnp.int32), jnp.full((rows,), p // 2, jnp.int32),
                      response_mask(jnp.full((rows,), n, jnp.int32), n), sample_logp=jnp.zeros((rows, n)),
                      rewards=jax.random.uniform(jax.random.key(2), (rows,)), valid=jnp.ones((rows,)),
                      num_groups=rows // 4, keep=rows // 4)
    args = (learner.init(jax.random.key(0), agent), rollout, {}, jax.random.key(1), jnp.int32(0))
    compiled = learner._program("update", agent).lower(*args).compile()
    jax.block_until_ready(args)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark
    jax.block_until_ready(compiled(*args))
    delta = status("VmHWM") - base
    print(json.dumps({"measured_working": delta, "plan_working": plan.programs["update"].working,
                      "resident": plan.resident, "plan_peak": plan.peak, "activations": plan.activations}))


if __name__ == "__main__":  # the subprocess of test_plan_matches_the_measured_peak_of_the_compiled_update
    measure_peak(sys.argv[1])


def test_multiturn_plan_holds_the_episode_cache_for_its_turns():
    """plan_episodes (tool use's --plan): the KV cache term is the carried cache of the step's episodes for T turns
    (growing with T), the update compiled for the episode's width, sampling's useful FLOPs counted; an episode past
    the model's window is refused before anything is compiled."""
    from jaxrl_reason.agents.tool_use import ToolUseConfig, tool_use_learner, tool_use_model
    from jaxrl_reason.rl.lm.multiturn import episode_cache_bytes
    from jaxrl_reason.rl.lm.plan import plan_episodes

    cfg = ToolUseConfig(prompts_per_step=2, group_size=2, turn_tokens=8)
    learner, agent = tool_use_learner(cfg, tool_use_model(cfg))
    with agent:
        p = learner.plan(agent, device_memory_bytes=1 << 40, flops_per_s=1e9, bandwidth=1e9)
        env = agent.envs[True]
        assert p.kv_cache == episode_cache_bytes(learner.model(learner.init(jax.random.key(0), agent)).cfg, 4,
                                                 env.prompt_tokens, cfg.max_turns, 8, env.obs_tokens)
        assert set(p.programs) == {"update"} and p.flops["sample"] > 0 and p.bytes["sample"] > 0
        assert f"{cfg.max_turns} turns" in p.summary() and "host loop" in p.summary()
        short = plan_episodes(learner, agent, env.prompt_tokens, 1, 8, env.obs_tokens, 4, flops_per_s=1e9,
                              bandwidth=1e9)
        assert short.kv_cache < p.kv_cache and short.flops["sample"] < p.flops["sample"]
        with pytest.raises(ValueError, match="past the model's max_seq_len"):
            plan_episodes(learner, agent, env.prompt_tokens, 50, 8, env.obs_tokens, 4)
