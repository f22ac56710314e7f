"""Decode throughput on an imported Hugging Face checkpoint: our jitted sampler vs transformers
`generate` (greedy, same weights, same prompts, same number of new tokens), and on a GPU the
fraction of the HBM roofline.

    python experiments/bench_hf_decode.py --preset cpu                 # tiny random Qwen3, ours vs HF generate
    python experiments/bench_hf_decode.py --preset cpu --model DIR     # a checkpoint directory instead
    python experiments/bench_hf_decode.py --preset gpu                 # Qwen2.5-0.5B-sized, random weights, ours only

cpu: without ``--model`` a tiny Qwen3 (Qwen2 where `load_hf_model` does not take qwen3) is made
with transformers (random init, seed ``seed``) and saved with ``save_pretrained`` into the run
directory, then imported. Both sides decode ``batch`` prompts of ``prompt_len`` random tokens for
exactly ``new_tokens`` tokens (no stop token), float32. Timings: one untimed call each (compile,
warm-up), then medians of ``rounds`` interleaved rounds (`utils.timing.interleaved`). Also reported:
the fraction of generated tokens on which both sides agree (greedy; near-ties in a random model
may flip a token, after which a row diverges), and process CPU seconds per call. torch runs on
``torch_threads`` threads (default 1: on the shared 2-core machine, under load, torch's 2 OpenMP
threads took 10-28 s for what 1 thread does in 0.9 s); XLA uses its own thread pool.
gpu: ours only (no transformers), roofline = peak bandwidth / (bytes of all weights + bytes of the
KV cache read per step at the mean context length), times the batch; peak bandwidth from `PEAK_BW`
by device kind unless ``peak_bandwidth`` is given. transformers / torch are imported only here
(the ``hf`` extra).
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer, cache_bytes_per_token, init_cache, param_count
from jaxrl_reason.models.lm.hf_reference import random_hf_checkpoint
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate, prepare
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

# peak HBM bandwidth (bytes/s) by a substring of jax's device_kind; first match wins
PEAK_BW = {"H200": 4.8e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12, "L4": 0.3e12,
           "TPU v5 lite": 0.819e12, "TPU v5e": 0.819e12, "TPU v5p": 2.765e12, "TPU v4": 1.2e12, "TPU v6": 1.64e12}


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    model: str = ""  # an HF checkpoint directory; "" = make a tiny random one (cpu) / random weights (gpu)
    hf: bool = True  # time transformers generate side by side (needs the `hf` extra)
    torch_threads: int = 1  # 0 = torch's default; on a shared, oversubscribed CPU its spinning threads collapse
    # the random model (Qwen3 layout; head_dim explicit)
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 768
    qwen25: bool = False  # the Qwen2.5 layout (qkv bias, no q/k norm, head_dim = d_model / n_heads), no transformers
    dtype: str = "float32"
    batch: int = 8
    prompt_len: int = 32
    new_tokens: int = 64
    rounds: int = 5
    scan_layers: bool = False  # unrolled: per-layer weights and cache in the decode loop (faster on CPU)
    peak_bandwidth: float = 0.0  # bytes/s; 0 = from PEAK_BW by device kind (roofline not reported if unknown)

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.batch, self.prompt_len, self.new_tokens, self.rounds) < 1:
            raise ValueError("batch, prompt_len, new_tokens, rounds must be >= 1")


PRESETS = {
    "cpu": Config(),
    # Qwen2.5-0.5B: 24 layers, d 896, 14 heads / 2 KV heads, d_ff 4864, vocab 151936, tied embeddings
    "gpu": Config(hf=False, qwen25=True, vocab_size=151_936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
                  head_dim=64, d_ff=4864, dtype="bfloat16", batch=8, prompt_len=128, new_tokens=256, scan_layers=False),
}


def _load_ours(c: Config, path: pathlib.Path):
    from jaxrl_reason.models.lm.hf_import import load_hf_model

    return load_hf_model(path, dtype=c.dtype, scan_layers=c.scan_layers, max_seq_len=c.prompt_len + c.new_tokens)


def _checkpoint(c: Config, run_dir: RunDir):
    """(checkpoint directory, model_type, our imported model): ``c.model``, or a tiny Qwen3 made
    here (Qwen2 where qwen3 does not import)."""
    import json

    from jaxrl_reason.models.lm.hf_import import HFImportError

    if c.model:
        path = pathlib.Path(c.model)
        return path, json.loads((path / "config.json").read_text()).get("model_type", "?"), _load_ours(c, path)
    for family in ("qwen3", "qwen2"):
        path = random_hf_checkpoint(run_dir.path / f"hf_{family}", family, vocab_size=c.vocab_size, d_model=c.d_model,
                                    n_layers=c.n_layers, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, d_ff=c.d_ff,
                                    max_len=c.prompt_len + c.new_tokens, head_dim=c.head_dim, seed=c.seed)
        try:
            return path, family, _load_ours(c, path)
        except HFImportError as e:
            if family != "qwen3" or "qwen3" not in str(e):
                raise
            print(f"qwen3 does not import yet ({e}); using a qwen2 checkpoint")
    raise AssertionError("unreachable")


def _random_model(c: Config):
    cfg = LMConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                   n_kv_heads=c.n_kv_heads, head_dim=c.d_model // c.n_heads if c.qwen25 else c.head_dim, d_ff=c.d_ff,
                   qkv_bias=c.qwen25, qk_norm=not c.qwen25, tie_embeddings=True, rope_theta=1e6, dtype=c.dtype,
                   param_dtype=c.dtype, max_seq_len=c.prompt_len + c.new_tokens, scan_layers=c.scan_layers)
    return nnx.jit(lambda: Transformer(cfg, rngs=nnx.Rngs(c.seed)))()


def run(config: Config, run_dir: RunDir) -> dict:
    c = config
    kind = str(jax.devices()[0].device_kind)
    summary: dict = {"device": kind, "backend": jax.default_backend(), "batch": c.batch, "prompt_len": c.prompt_len,
                     "new_tokens": c.new_tokens, "rounds": c.rounds}
    if c.model or c.hf:
        path, family, model = _checkpoint(c, run_dir)
    else:
        path, family, model = None, "random (" + ("qwen2.5" if c.qwen25 else "qwen3") + " layout)", _random_model(c)
    summary.update(model_type=family, params=param_count(model), vocab_size=model.cfg.vocab_size)
    prompts = np.random.default_rng(c.seed).integers(0, model.cfg.vocab_size, (c.batch, c.prompt_len))
    scfg = SamplerConfig(max_new_tokens=c.new_tokens, temperature=0.0)
    graphdef, state = nnx.split(model)
    args = prepare(model.cfg, prompts, None, scfg)
    fns = {"ours": lambda i: generate(graphdef, state, *args[:2], jax.random.PRNGKey(i), *args[2:], config=scfg).tokens}
    if c.hf:
        import torch
        import transformers

        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, c.dtype)).eval()
        pt = torch.tensor(prompts)
        kw = dict(attention_mask=torch.ones_like(pt), max_new_tokens=c.new_tokens, min_new_tokens=c.new_tokens,
                  do_sample=False, pad_token_id=0)

        def hf_generate(i):
            with torch.no_grad():
                return hf.generate(pt, **kw)[:, c.prompt_len:]

        fns["hf"] = hf_generate
        summary["torch_threads"] = torch.get_num_threads()
    t = timing.interleaved(fns, c.rounds)
    for name, tm in t.items():
        summary[f"{name}_median_s"] = tm.median
        summary[f"{name}_cpu_median_s"] = tm.cpu_median
        summary[f"{name}_tokens_per_s"] = c.batch * c.new_tokens / tm.median
    if c.hf:
        summary["ratio_ours_vs_hf"] = summary["ours_tokens_per_s"] / summary["hf_tokens_per_s"]
        ours, theirs = np.asarray(fns["ours"](0)), fns["hf"](0).numpy()
        summary["greedy_token_agreement"] = float(np.mean(ours == theirs))
    bw = c.peak_bandwidth or next((v for k, v in PEAK_BW.items() if k in kind), 0.0)
    if bw:
        wbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        per_token = cache_bytes_per_token(jax.eval_shape(lambda: init_cache(model.cfg, 1, 8)))
        kv = per_token * (c.prompt_len + c.new_tokens / 2) * c.batch  # mean context, all rows
        roofline = bw / (wbytes + kv) * c.batch  # tokens/s if every step only streamed weights + KV once
        summary.update(peak_bandwidth=bw, bytes_per_step=wbytes + kv, roofline_tokens_per_s=roofline,
                       roofline_percent=100 * summary["ours_tokens_per_s"] / roofline)
    print(run_dir.write_table("bench_hf_decode", [{"metric": k, "value": v} for k, v in summary.items()]))
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
