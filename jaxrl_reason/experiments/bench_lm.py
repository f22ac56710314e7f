"""LM stack benchmark: sampler decode tokens/s (vs HF transformers `generate` on the same weights,
side by side in one process), prefill tokens/s, train-step tokens/s and MFU, KV-cache bytes/token
for MHA / GQA / MLA, FP8-vs-bf16 training loss curves of a tiny model (plot `fp8_vs_bf16.png`),
and (GPU preset) decode as a fraction of the memory-bandwidth roofline.
MFU: against `peak_flops` when given (GPU preset: H200 dense bf16); with peak_flops=0 (CPU) it is
reported against the measured throughput of one large jitted matmul in the same dtype
(`train_mfu_vs_matmul`), since a CPU's nominal peak is not known here.

    python experiments/bench_lm.py --preset cpu        # tiny Qwen2 of experiments/anchors/bench_hf_generate.py
    python experiments/bench_lm.py --preset gpu        # ~300M dense train MFU, ~1B decode at batch 1

The model is built in transformers (random init, seed 0), saved as safetensors and imported, so both
sides run identical weights; both sample with temperature 1, no top-k, no early stop.
Ours is timed on one device and (``data_parallel`` > 1) with the batch split over that many devices,
one decode loop each (`generate_data_parallel`); on the CPU those are host devices, one per core
(``jax_num_cpu_devices``, set before the first JAX operation), against torch's intra-op threads.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_reason.models.lm import LMConfig, Transformer, cache_bytes_per_token, init_cache, param_count
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate, generate_data_parallel, prepare
from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step
from jaxrl_reason.parallel.mesh import make_mesh
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # sampler model (Qwen2 layout, built in transformers when hf is on)
    vocab_size: int = 512
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    d_ff: int = 704
    dtype: str = "float32"
    batch: int = 16
    prompt_len: int = 32
    new_tokens: int = 128
    repeats: int = 5  # interleaved rounds for the sampler (median); best of `repeats` elsewhere
    hf: bool = True  # time HF generate side by side (needs the `hf` extra)
    torch_threads: int = 0  # 0: torch's default; 1 is fairer on a heavily shared CPU (spinning threads)
    scan_layers: bool = True  # False: unroll the layer scan in the sampler model
    data_parallel: int = 0  # > 1: also time ours with the batch split over this many devices (CPU: host devices)
    # train step
    train_batch: int = 8
    train_len: int = 128
    train_steps: int = 5
    train_d_model: int = 256
    train_layers: int = 4
    train_vocab: int = 512
    train_d_ff: int = 704
    train_heads: int = 8
    remat: bool = False
    peak_flops: float = 0.0  # device peak FLOP/s for MFU (0: MFU not reported)
    peak_bandwidth: float = 0.0  # device bytes/s for the decode roofline (0: not reported)
    # FP8 vs bf16 loss curves (tiny dense model, counting task); 0 steps: skipped
    fp8_steps: int = 40
    fp8_block: int = 32

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.batch, self.prompt_len, self.new_tokens, self.repeats, self.train_steps) < 1:
            raise ValueError("batch, prompt_len, new_tokens, repeats, train_steps must be >= 1")
        if self.fp8_steps < 0 or self.fp8_block < 1:
            raise ValueError(f"fp8_steps must be >= 0 and fp8_block >= 1, got {self.fp8_steps}, {self.fp8_block}")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must divide d_model and be a multiple of n_kv_heads")
        if self.data_parallel > 1 and self.batch % self.data_parallel:
            raise ValueError(f"batch {self.batch} must be divisible by data_parallel {self.data_parallel}")


PRESETS = {
    # unrolled layers: the sampler keeps per-layer weights and cache in its decode loop (no per-step copies);
    # data_parallel=2: one host device per core of the 2-core CPU machine
    "cpu": Config(scan_layers=False, data_parallel=2),
    "gpu": Config(vocab_size=32000, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=4, d_ff=5632, dtype="bfloat16",
                  batch=1, prompt_len=128, new_tokens=512, hf=False, train_batch=16, train_len=2048, train_steps=10,
                  train_d_model=1024, train_layers=24, train_vocab=32000, train_d_ff=2816, train_heads=16, remat=True,
                  peak_flops=790e12, peak_bandwidth=4.3e12),
}


def _best_seconds(fn, repeats: int) -> float:
    """Best wall seconds of ``repeats`` calls of ``fn()`` after one warm-up."""
    return timing.interleaved({"f": lambda i: fn()}, repeats)["f"].best


def _hf_model(c: Config):
    import torch
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                                   num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                                   num_key_value_heads=c.n_kv_heads, max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(c.seed)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def data_mesh(n: int) -> Mesh:
    """Mesh ``data=n`` over the first ``n`` devices; asks for ``n`` CPU host devices first (which only
    works before the process's first JAX operation)."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # backend already up: use the devices it has
        pass
    if len(jax.devices()) < n:
        raise ValueError(f"data_parallel={n} needs {n} devices, this process has {len(jax.devices())} "
                         "(on the CPU: run the script in a fresh process)")
    return make_mesh(f"data={n}", jax.devices()[:n])


def bench_sampler(c: Config, mesh: Mesh | None = None) -> dict:
    """Decode tokens/s of our sampler (one device; with ``mesh``, also data-parallel over its ``data``
    axis) and (``hf``) of HF generate on the same weights, median of ``repeats`` interleaved rounds."""
    out: dict = {}
    scfg = SamplerConfig(max_new_tokens=c.new_tokens, temperature=1.0)
    prompts = np.random.default_rng(c.seed).integers(0, c.vocab_size, (c.batch, c.prompt_len))
    fns = {}
    if c.hf:
        import torch

        from jaxrl_reason.models.lm.hf_import import load_hf_model

        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        hf = _hf_model(c)
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d, safe_serialization=True)
            model = load_hf_model(d, max_seq_len=1024, dtype=c.dtype, scan_layers=c.scan_layers)
        kw = dict(max_new_tokens=c.new_tokens, min_new_tokens=c.new_tokens, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0)
        pt = torch.tensor(prompts)

        def hf_generate(i):
            with torch.no_grad():
                return hf.generate(pt, **kw)

        fns["hf"] = hf_generate
        out["torch_threads"] = torch.get_num_threads()
    else:
        cfg = LMConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                       n_kv_heads=c.n_kv_heads, d_ff=c.d_ff, qkv_bias=True, tie_embeddings=True, dtype=c.dtype,
                       param_dtype=c.dtype, max_seq_len=c.prompt_len + c.new_tokens, scan_layers=c.scan_layers)
        model = Transformer(cfg, rngs=nnx.Rngs(c.seed))
    graphdef, state = nnx.split(model)
    args = prepare(model.cfg, prompts, None, scfg)
    fns["ours"] = lambda i: generate(graphdef, state, *args[:2], jax.random.PRNGKey(i), *args[2:], config=scfg).tokens
    if mesh is not None:
        rstate = jax.device_put(state, NamedSharding(mesh, P()))
        dargs = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in args]
        fns["ours_data_parallel"] = lambda i: generate_data_parallel(
            graphdef, rstate, *dargs[:2], jax.random.PRNGKey(i), *dargs[2:], config=scfg, mesh=mesh).tokens
    t = timing.interleaved(fns, c.repeats)
    rate = {name: c.batch * c.new_tokens / timings.median for name, timings in t.items()}
    for name, suffix in (("ours", ""), ("ours_data_parallel", "_data_parallel")):
        if name in rate:
            out[f"decode{suffix}_tokens_per_s"] = rate[name]
            if c.hf:
                out[f"ratio{suffix}_vs_hf"] = rate[name] / rate["hf"]
    if c.hf:
        out["hf_generate_tokens_per_s"] = rate["hf"]

    @jax.jit
    def prefill(state, toks):
        m = nnx.merge(graphdef, state)
        cache = init_cache(m.cfg, toks.shape[0], toks.shape[1])
        h, cache, _ = m.hidden(toks, None, cache)
        return m.logits(h[:, -1]), cache

    toks = jnp.asarray(prompts, jnp.int32)
    out["prefill_tokens_per_s"] = c.batch * c.prompt_len / _best_seconds(lambda: prefill(state, toks), c.repeats)
    out["params"] = param_count(model)
    if c.peak_bandwidth:
        # batch-1 decode reads every weight and the cache once per step
        wbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        cbytes = cache_bytes_per_token(jax.eval_shape(lambda: init_cache(model.cfg, 1, 8))) * (c.prompt_len + c.new_tokens / 2)
        roofline = c.peak_bandwidth / (wbytes + cbytes) * c.batch
        out["decode_roofline_fraction"] = out["decode_tokens_per_s"] / roofline
    return out


def bench_train(c: Config) -> dict:
    cfg = LMConfig(vocab_size=c.train_vocab, d_model=c.train_d_model, n_layers=c.train_layers, n_heads=c.train_heads,
                   n_kv_heads=c.train_heads, d_ff=c.train_d_ff, dtype=c.dtype, remat=c.remat, max_seq_len=c.train_len)
    model = Transformer(cfg, rngs=nnx.Rngs(c.seed))
    opt = make_optimizer(1e-3, 1000)
    graphdef, state = init_train_state(model, opt)
    step = make_train_step(graphdef, opt, chunk=min(512, c.train_len))
    toks = jax.random.randint(jax.random.PRNGKey(0), (c.train_batch, c.train_len), 0, cfg.vocab_size)
    batch = {"tokens": toks, "loss_mask": jnp.ones((c.train_batch, c.train_len - 1))}
    holder = [state]

    def one():
        holder[0], m = step(holder[0], batch)
        return m["loss"]

    jax.block_until_ready(one())
    t = time.perf_counter()
    for _ in range(c.train_steps):
        loss = one()
    jax.block_until_ready(loss)
    dt = (time.perf_counter() - t) / c.train_steps
    n = param_count(model) - cfg.vocab_size * cfg.d_model  # non-embedding params (head counted once)
    flops_per_token = 6 * n + 12 * cfg.n_layers * c.train_len * cfg.d_model  # PaLM appendix B
    tps = c.train_batch * c.train_len / dt
    out = {"train_tokens_per_s": tps, "train_params": param_count(model), "train_tflops_per_s": tps * flops_per_token / 1e12}
    if c.peak_flops:
        out["train_mfu"] = tps * flops_per_token / c.peak_flops
    else:
        peak = _matmul_flops(cfg.jdtype)
        out["matmul_peak_tflops_per_s"] = peak / 1e12
        out["train_mfu_vs_matmul"] = tps * flops_per_token / peak
    return out


def _matmul_flops(dtype, n: int = 1024) -> float:
    """Measured FLOP/s of one jitted n x n x n matmul (the reference 'peak' when none is given)."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    return 2 * n**3 / _best_seconds(lambda: f(a), 5)


def bench_fp8(c: Config, run_dir: RunDir) -> dict:
    """Train the same tiny dense model (bf16 activations) with bf16 and with FP8 matmuls; log and plot
    both next-token NLL curves (same init, same data)."""
    base = LMConfig(vocab_size=64, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, dtype="bfloat16",
                    fp8_block=c.fp8_block, max_seq_len=32)
    curves = {}
    for name, cfg in (("bf16", base), ("fp8", dataclasses.replace(base, fp8=True))):
        opt = make_optimizer(2e-2, c.fp8_steps, warmup_steps=5)
        graphdef, state = init_train_state(Transformer(cfg, rngs=nnx.Rngs(c.seed)), opt)
        step = make_train_step(graphdef, opt, chunk=16)
        key, hist = jax.random.PRNGKey(c.seed), []
        for _ in range(c.fp8_steps):
            key, sub = jax.random.split(key)
            toks = (jax.random.randint(sub, (8, 1), 0, cfg.vocab_size) + jnp.arange(32)) % cfg.vocab_size
            state, met = step(state, {"tokens": toks, "loss_mask": jnp.ones((8, 31))})
            hist.append(float(met["nll"]))
        curves[name] = np.array(hist)
    for i in range(c.fp8_steps):
        run_dir.log(i, {"bf16_nll": curves["bf16"][i], "fp8_nll": curves["fp8"][i]})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    for name, y in curves.items():
        ax.plot(y, label=f"{name} matmuls")
    ax.set_xlabel("step")
    ax.set_ylabel("next-token NLL")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir.path / "fp8_vs_bf16.png", dpi=100)
    plt.close(fig)
    gap = np.abs(curves["fp8"] - curves["bf16"])
    return {"fp8_nll_first": curves["fp8"][0], "bf16_nll_last": curves["bf16"][-1], "fp8_nll_last": curves["fp8"][-1],
            "fp8_max_gap_over_initial_nll": float(gap.max() / curves["bf16"][0])}


def kv_bytes_table(c: Config) -> list[dict]:
    """KV-cache bytes per token (all layers, f32) for MHA / GQA / MLA at this model width."""
    base = dict(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads, d_ff=c.d_ff)
    hd = c.d_model // c.n_heads
    variants = {
        "MHA": LMConfig(**base, n_kv_heads=c.n_heads),
        "GQA": LMConfig(**base, n_kv_heads=c.n_kv_heads),
        "MLA": LMConfig(**base, attention="mla", kv_lora_rank=4 * hd, qk_rope_dim=hd // 2, qk_nope_dim=hd, v_head_dim=hd),
    }
    rows = []
    for name, cfg in variants.items():
        cache = jax.eval_shape(lambda cfg=cfg: init_cache(cfg, 1, 16))
        per_layer = "2*n_kv*d_h" if cfg.attention == "gqa" else "d_c + d_rope"
        rows.append({"attention": name, "bytes_per_token": cache_bytes_per_token(cache),
                     "values_per_token_per_layer": cfg.cache_values_per_token() // cfg.n_layers, "formula": per_layer})
    return rows


def run(config: Config, run_dir: RunDir) -> dict:
    mesh = data_mesh(config.data_parallel) if config.data_parallel > 1 else None  # before any JAX operation
    summary = {"device": str(jax.devices()[0].device_kind), "backend": jax.default_backend()}
    summary.update(bench_sampler(config, mesh))
    summary.update(bench_train(config))
    if config.fp8_steps:
        summary.update(bench_fp8(config, run_dir))
    table = run_dir.write_table("kv_cache_bytes", kv_bytes_table(config))
    print(table)
    rows = [{"metric": k, "value": v} for k, v in summary.items()]
    print(run_dir.write_table("bench_lm", rows))
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
