"""Training utilities: chunked log-probs == full, SFT learning with MTP, MoE bias balancing, FP8."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.fp8 import fp8_matmul, quantize_tiles, dequantize_tiles
from jaxrl_reason.models.lm.moe import max_over_mean_load, route
from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step, token_logprobs


def test_chunked_logprobs_equal_full():
    cfg = LMConfig(vocab_size=96, d_model=32, n_heads=4, n_kv_heads=2)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    toks = jax.random.randint(jax.random.PRNGKey(0), (2, 11), 0, 96)
    got = nnx.jit(lambda m, t: token_logprobs(m, t, chunk=4))(model, toks)  # 10 targets, padded to 12
    logits = nnx.jit(lambda m, t: m(t)[0])(model, toks)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), toks[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def _train(cfg, steps, lr=1e-2, seed=0, batch=8, length=16):
    """Train on a counting task (token t+1 = token t + 1 mod V); returns (state, list of metrics)."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    opt = make_optimizer(lr, steps, warmup_steps=5)
    graphdef, state = init_train_state(model, opt)
    step = make_train_step(graphdef, opt, chunk=8)
    key = jax.random.PRNGKey(seed)
    hist = []
    for _ in range(steps):
        key, sub = jax.random.split(key)
        start = jax.random.randint(sub, (batch, 1), 0, cfg.vocab_size)
        toks = (start + jnp.arange(length)) % cfg.vocab_size
        mask = jnp.ones((batch, length - 1))
        state, met = step(state, {"tokens": toks, "loss_mask": mask})
        hist.append(jax.device_get(met))
    return state, hist


MOE = LMConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_routed_experts=8, moe_top_k=2,
               moe_d_ff=16, moe_n_groups=2, moe_topk_groups=2, moe_bias_update_rate=1e-2, mtp_depth=1, remat=True)


@pytest.mark.slow
def test_sft_learns_copy_task_with_mtp_and_moe():
    _, hist = _train(MOE, 60)
    first, last = hist[0], hist[-1]
    assert last["nll"] < 0.5 * first["nll"], (first["nll"], last["nll"])
    assert last["mtp_nll"] < 0.7 * first["mtp_nll"]


@pytest.mark.slow
def test_aux_loss_free_bias_balances_experts():
    """Router skewed at init towards experts 0, 1. Expert load averaged over the last 50 of 150 steps:
    max/mean < 1.5 with the bias update on, much higher with it off."""
    cfg = dataclasses.replace(MOE, mtp_depth=0, remat=False, moe_n_groups=1, moe_topk_groups=1)

    def run(rate):
        c = dataclasses.replace(cfg, moe_bias_update_rate=rate)
        model = Transformer(c, rngs=nnx.Rngs(0))
        skew = jnp.zeros((c.d_model, c.n_routed_experts)).at[:, :2].set(0.3)
        model.blocks.mlp.router[...] = model.blocks.mlp.router[...] + skew
        opt = make_optimizer(1e-3, 150)
        graphdef, state = init_train_state(model, opt)
        step = make_train_step(graphdef, opt, chunk=16)
        key, loads = jax.random.PRNGKey(1), []
        for _ in range(150):
            key, sub = jax.random.split(key)
            toks = jax.random.randint(sub, (8, 16), 1, c.vocab_size)
            state, met = step(state, {"tokens": toks, "loss_mask": jnp.ones((8, 15))})
            loads.append(met["load"])
        return float(jnp.max(max_over_mean_load(jnp.mean(jnp.stack(loads[-50:]), 0))))

    on, off = run(1e-2), run(0.0)
    print(f"max/mean expert load: bias update on {on:.2f}, off {off:.2f}")
    assert on < 1.5 and off > 2.0, (on, off)


def test_routing_uses_bias_for_choice_only():
    cfg = LMConfig(n_routed_experts=4, moe_top_k=2)
    scores = jnp.array([[0.9, 0.8, 0.1, 0.2]])
    idx, w = route(scores, jnp.array([0.0, 0.0, 1.0, 1.0]), cfg)
    assert set(np.asarray(idx[0]).tolist()) == {2, 3}
    np.testing.assert_allclose(np.sort(np.asarray(w[0])), [1 / 3, 2 / 3], atol=1e-6)
    grouped = dataclasses.replace(cfg, moe_n_groups=2, moe_topk_groups=1)
    idx, _ = route(jnp.array([[0.9, 0.0, 0.5, 0.5]]), jnp.zeros(4), grouped)  # group 2 sums higher
    assert set(np.asarray(idx[0]).tolist()) == {2, 3}


def test_fp8_matmul_error_and_grad():
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 256))
    w = jax.random.normal(jax.random.PRNGKey(1), (256, 96)) * 0.05
    y, ref = jax.jit(fp8_matmul, static_argnums=2)(x, w, 128), jnp.dot(x, w, precision="highest")
    rel = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
    assert 1e-3 < rel < 5e-2, rel  # quantised (not exact), but within DeepSeek-level error
    q, s = quantize_tiles(x, 128)
    assert q.dtype == jnp.float8_e4m3fn and s.shape == (64, 2)
    assert float(jnp.max(jnp.abs(dequantize_tiles(q, s, 256) - x)) / jnp.max(jnp.abs(x))) < 0.07
    gx, gw = jax.jit(jax.grad(lambda a, b: jnp.sum(fp8_matmul(a, b, 128) ** 2), (0, 1)))(x, w)
    rx, rw = jax.jit(jax.grad(lambda a, b: jnp.sum((a @ b) ** 2), (0, 1)))(x, w)
    assert float(jnp.linalg.norm(gx - rx) / jnp.linalg.norm(rx)) < 0.1
    assert float(jnp.linalg.norm(gw - rw) / jnp.linalg.norm(rw)) < 0.1


@pytest.mark.slow
def test_fp8_training_tracks_bf16():
    base = LMConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, dtype="bfloat16", fp8_block=16)
    _, h16 = _train(base, 20, lr=2e-2, batch=4)
    _, h8 = _train(dataclasses.replace(base, fp8=True), 20, lr=2e-2, batch=4)
    l16, l8 = np.array([m["nll"] for m in h16]), np.array([m["nll"] for m in h8])
    print("nll bf16", l16[::5], "fp8", l8[::5])
    assert l16[-1] < 0.6 * l16[0]
    assert np.max(np.abs(l8[-5:] - l16[-5:])) < 0.1 * l16[0], (l8[-5:], l16[-5:])
