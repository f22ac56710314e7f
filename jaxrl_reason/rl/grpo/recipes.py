"""Shared pieces of the small-scale GRPO studies (r1_zero, prorl, spurious_rewards, the notebook):
a tiny char-level LM, seeded data splits, the partial SFT warm start and a GRPO run with periodic
held-out evaluation driven by ``utils.loop.run_chunks`` (checkpoints + exact resume).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.rl.grpo.trainer import GRPOTrainer
from jaxrl_reason.tasks.base import make_batch, sample_problems
from jaxrl_reason.tasks.vocab import VOCAB
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.loop import run_chunks
from jaxrl_reason.utils.validation import check_hyperparameters

# seed streams: the trainer draws step s from default_rng([seed, s]); these 3-element seeds never collide
SFT_STREAM, HELDOUT_STREAM = (2**31 - 1, 11), (2**31 - 1, 13)


@dataclasses.dataclass(frozen=True)
class TinyLM:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    max_seq_len: int = 96
    dtype: str = "float32"  # activations / matmuls (parameters stay float32)
    scan_layers: bool = True  # False: unrolled; the sampler then keeps per-layer weights and cache

    def __post_init__(self):
        check_hyperparameters(self)

    def config(self) -> LMConfig:
        return LMConfig(vocab_size=VOCAB.size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                        n_kv_heads=self.n_heads, d_ff=self.d_ff, max_seq_len=self.max_seq_len, dtype=self.dtype,
                        scan_layers=self.scan_layers)


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Deliberately partial SFT: few problems, few steps, so RL has headroom."""

    problems: int = 256
    steps: int = 150
    batch_size: int = 32
    lr: float = 3e-3
    seq_len: int = 64

    def __post_init__(self):
        check_hyperparameters(self)


def build_model(lm: TinyLM, seed: int) -> Transformer:
    return Transformer(lm.config(), rngs=nnx.Rngs(seed))


def sft_problems(tasks: Sequence, n: int, seed: int, weights=None):
    rng = np.random.default_rng([seed, *SFT_STREAM])
    return sample_problems(list(tasks), np.ones(len(tasks)) if weights is None else weights, rng, n)[0]


def heldout(tasks: Sequence, n: int, seed: int, prompt_len: int, answer_len: int, weights=None):
    return make_batch(list(tasks), np.random.default_rng([seed, *HELDOUT_STREAM]), n, prompt_len, answer_len, weights)


def warm_started_model(lm: TinyLM, ws: WarmStart, tasks: Sequence, seed: int, weights=None) -> Transformer:
    model = build_model(lm, seed)
    sft_warm_start(model, sft_problems(tasks, ws.problems, seed, weights), ws.steps, ws.batch_size, ws.seq_len,
                   ws.lr, seed=seed)
    return model


def check_schedule(rl_steps: int, eval_every: int) -> None:
    """The experiments' RL schedule: ``rl_steps`` a positive multiple of ``eval_every`` (ValueError otherwise)."""
    if rl_steps < 1 or eval_every < 1 or rl_steps % eval_every:
        raise ValueError(f"rl_steps ({rl_steps}) must be a positive multiple of eval_every ({eval_every})")


def train(run_dir: RunDir, trainer: GRPOTrainer, state, num_steps: int, eval_every: int,
          evaluate: Callable[[object], dict] | None = None, desc: str = "grpo"):
    """GRPO for ``num_steps`` (a multiple of ``eval_every``); after every ``eval_every`` steps
    ``evaluate(model) -> {name: scalar}`` is logged (prefixed "eval/") at that step. Resumes exactly."""
    check_schedule(num_steps, eval_every)
    inner = trainer.chunk_fn(eval_every)

    def chunk(state):
        state, metrics = inner(state)
        if evaluate is not None:
            run_dir.log(int(state.step), {f"eval/{k}": v for k, v in evaluate(trainer.model(state)).items()})
        return state, metrics

    if evaluate is not None and not run_dir.resumed:
        run_dir.log(0, {f"eval/{k}": v for k, v in evaluate(trainer.model(state)).items()})
    state = run_chunks(run_dir, state, chunk, num_steps // eval_every, steps_per_chunk=eval_every, desc=desc)
    run_dir.close()
    return state


def series(run_dir: RunDir, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric from a run's metrics.jsonl."""
    pts = [(r["step"], r[key]) for r in run_dir.read_metrics() if key in r]
    return (np.array([p[0] for p in pts]), np.array([p[1] for p in pts])) if pts else (np.zeros(0), np.zeros(0))


def plot_curves(path, panels: dict[str, dict[str, tuple]], title: str = "", marks: dict[str, Sequence] | None = None):
    """panels: {panel title: {curve label: (x, y)}} -> one PNG; ``marks`` draws vertical lines per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items()):
        for label, (x, y) in curves.items():
            ax.plot(x, y, label=label, marker="." if len(x) < 40 else None)
        for x in (marks or {}).get(name, ()):
            ax.axvline(x, color="grey", lw=0.6, ls=":")
        ax.set_title(name)
        ax.set_xlabel("RL step")
        if len(curves) > 1:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
