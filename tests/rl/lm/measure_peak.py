"""Run by ``test_plan``'s subprocess: plan a small GRPO run, then run its compiled update once and measure the
resident memory it adds (``VmHWM`` after ``clear_refs`` minus ``VmRSS`` before, glibc's free memory trimmed
first). Prints one JSON line: the plan's figures and the measurement (bytes)."""

import ctypes
import json
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.grpo.trainer import GRPOConfig, GRPOTrainer
from jaxrl_reason.rl.lm.plan import plan_grpo
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def main(remat: str, d: int = 128, layers: int = 2, rows: int = 32, n: int = 96, p: int = 16):
    tok = CharTokenizer()
    model = Transformer(LMConfig(vocab_size=tok.vocab_size, d_model=d, n_layers=layers, n_heads=4, n_kv_heads=4,
                                 d_ff=4 * d, max_seq_len=p + n), rngs=nnx.Rngs(0))
    cfg = GRPOConfig(prompts_per_step=rows // 4, group_size=4, max_new_tokens=n, reward=RewardConfig("random"),
                     remat=remat)
    tr = GRPOTrainer.for_tasks(cfg, model, tok, [RandomCalculation(max_difficulty=1, ops="+-")], prompt_len=p)
    plan = plan_grpo(tr, flops_per_s=1e10)
    args = (tr.init(jax.random.key(0)), jax.random.key(1), jnp.ones((rows, p), jnp.int32),
            jnp.full((rows,), p // 2, jnp.int32), jnp.ones((rows, n), jnp.int32), jnp.full((rows,), n, jnp.int32),
            jnp.zeros((rows, n)), {}, jax.random.uniform(jax.random.key(2), (rows // 4, 4)), jnp.int32(0))
    compiled = tr._update.lower(*args).compile()
    jax.block_until_ready(args)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark
    jax.block_until_ready(compiled(*args))
    delta = status("VmHWM") - base
    print(json.dumps({"measured_working": delta, "plan_working": plan.programs["update"].working,
                      "resident": plan.resident, "plan_peak": plan.peak, "activations": plan.activations}))


if __name__ == "__main__":
    main(sys.argv[1])
