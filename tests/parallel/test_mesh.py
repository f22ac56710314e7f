"""Mesh specs, partition rules and the sharded train step on 8 virtual CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_reason.parallel import mesh as mesh_lib

RULES = [(r"w1$", P("fsdp", "tensor")), (r"w2$", P("tensor", None)), (r"b1$", P("tensor"))]


def _params(rng):
    return {
        "layer": {"w1": rng.normal(size=(16, 32)).astype(np.float32) * 0.2,
                  "b1": np.zeros(32, np.float32)},
        "w2": rng.normal(size=(32, 4)).astype(np.float32) * 0.2,
    }


def _loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["layer"]["w1"] + params["layer"]["b1"])
    return jnp.mean(jnp.square(h @ params["w2"] - batch["y"]))


def test_eight_devices_available():
    assert jax.device_count() == 8, "tests/conftest.py must force 8 host devices"


def test_mesh_spec_parsing_and_errors():
    mesh = mesh_lib.make_mesh("data=2,fsdp=2,tensor=2")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(mesh_lib.make_mesh("data=-1,tensor=2").shape) == {"data": 4, "tensor": 2}
    with pytest.raises(ValueError, match="needs 6 devices but 8 are available"):
        mesh_lib.make_mesh("data=3,tensor=2")
    with pytest.raises(ValueError, match="axis=size"):
        mesh_lib.make_mesh("data:2")
    with pytest.raises(ValueError, match="appears twice"):
        mesh_lib.make_mesh("data=2,data=4")


def test_partition_rules_match_paths_and_optimizer_state():
    params = _params(np.random.default_rng(0))
    specs = mesh_lib.match_partition_rules(RULES, params)
    assert specs["layer"]["w1"] == P("fsdp", "tensor") and specs["w2"] == P("tensor", None)
    opt_specs = mesh_lib.match_partition_rules(RULES, optax.adam(1e-3).init(params))
    assert opt_specs[0].mu["layer"]["w1"] == P("fsdp", "tensor")
    assert opt_specs[0].count == P()
    with pytest.raises(ValueError, match="rank"):
        mesh_lib.match_partition_rules([("b1", P("fsdp", "tensor"))], params)


def test_sharded_step_equals_single_device_step():
    rng = np.random.default_rng(1)
    params = _params(rng)
    batch = {"x": rng.normal(size=(16, 16)).astype(np.float32), "y": rng.normal(size=(16, 4)).astype(np.float32)}
    opt = optax.adam(1e-2)
    mesh = mesh_lib.make_mesh("data=2,fsdp=2,tensor=2")
    specs = mesh_lib.match_partition_rules(RULES, params)
    opt_specs = mesh_lib.match_partition_rules(RULES, opt.init(params))
    step = mesh_lib.make_sharded_train_step(_loss, opt, mesh, specs, opt_specs, batch_axes=("data", "fsdp"))
    p = mesh_lib.shard_pytree(params, mesh, specs)
    o = mesh_lib.shard_pytree(opt.init(params), mesh, opt_specs)
    ref_p, ref_o = params, opt.init(params)
    for _ in range(3):
        p, o, loss = step(p, o, batch)
        ref_loss, g = jax.value_and_grad(_loss)(ref_p, batch)
        u, ref_o = opt.update(g, ref_o, ref_p)
        ref_p = optax.apply_updates(ref_p, u)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    assert p["layer"]["w1"].sharding.spec == P("fsdp", "tensor")
    assert len(p["layer"]["w1"].addressable_shards) == 8
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(ref_p)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not divisible by the dataxfsdp mesh axes"):
        step(p, o, {"x": batch["x"][:6], "y": batch["y"][:6]})
