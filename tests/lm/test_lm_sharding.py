"""Sharded forward / train step / sampler on 8 virtual CPU devices == single device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate, prepare
from jaxrl_reason.models.lm.sharding import batch_sharding, fit_spec, param_specs, shard_state
from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step
from jaxrl_reason.parallel.mesh import make_mesh

CFG = LMConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, attention="mla", kv_lora_rank=16,
               qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8, n_routed_experts=4, moe_top_k=2, moe_d_ff=16)
TOKS = jax.random.randint(jax.random.PRNGKey(0), (8, 12), 0, 64)


@pytest.fixture(scope="module")
def setup():
    if jax.device_count() < 8:
        pytest.skip("needs 8 (virtual) devices")
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    mesh = make_mesh("data=2,expert=2,tensor=2")
    return model, mesh


def test_specs_fit_mesh(setup):
    model, mesh = setup
    specs = param_specs(nnx.state(model), mesh)
    assert specs["blocks"]["mlp"]["w_gate"].get_value() == P(None, "expert", None, "tensor")
    assert fit_spec(P("tensor"), (3,), {"tensor": 2}) == P(None)  # 3 not divisible: replicated


def test_sharded_train_step_matches_single_device(setup):
    model, mesh = setup
    opt = make_optimizer(1e-2, 10)
    graphdef, state = init_train_state(model, opt)
    step = make_train_step(graphdef, opt, chunk=4)
    batch = {"tokens": TOKS, "loss_mask": jnp.ones((8, 11))}
    state1, m1 = step(jax.tree.map(jnp.copy, state), batch)
    with jax.set_mesh(mesh):
        copy = jax.tree.map(jnp.copy, state)  # the step donates its state
        sstate = copy.replace(params=shard_state(copy.params, mesh))
        sbatch = {k: jax.device_put(v, batch_sharding(mesh, v.shape)) for k, v in batch.items()}
        state2, m2 = step(sstate, sbatch)
    assert len(state2.params["blocks"]["mlp"]["w_up"][...].sharding.device_set) == 8
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["load"], m2["load"], atol=1e-6)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state2.params)):
        np.testing.assert_allclose(a, b, atol=2e-5)
    np.testing.assert_allclose(state1.rest["blocks"]["mlp"]["bias"][...], state2.rest["blocks"]["mlp"]["bias"][...])


def test_sharded_sampler_matches_single_device(setup):
    model, mesh = setup
    cfg = SamplerConfig(max_new_tokens=5, temperature=0.0)
    args = prepare(CFG, TOKS[:, :6], None, cfg)
    graphdef, state = nnx.split(model)
    ref = generate(graphdef, state, *args[:2], jax.random.PRNGKey(0), *args[2:], config=cfg)
    with jax.set_mesh(mesh):
        sargs = [jax.device_put(a, batch_sharding(mesh, a.shape)) for a in args]
        out = generate(graphdef, shard_state(state, mesh), *sargs[:2], jax.random.PRNGKey(0), *sargs[2:], config=cfg)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
