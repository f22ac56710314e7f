"""Checkpoints: round trip, missing / corrupt / mismatched checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.utils.checkpoint import CheckpointError, Checkpointer


def _state(seed=0):
    return {"w": jnp.arange(6.0).reshape(2, 3) + seed, "key": jax.random.key(seed), "n": jnp.int32(seed),
            "empty": jnp.zeros((3, 0))}


def test_checkpoint_round_trip_and_errors(tmp_path):
    ck = Checkpointer(tmp_path / "ck", interval=2)
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        ck.restore(_state())
    assert not ck.save(1, _state(1))  # not due
    assert ck.save(2, _state(2)) and ck.save(3, _state(3), force=True)
    step, restored = ck.restore(_state())
    assert step == 3
    np.testing.assert_array_equal(restored["w"], _state(3)["w"])
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(_state(3)["key"]))
    with pytest.raises(CheckpointError, match="model or config changed"):
        ck.restore({"w": jnp.zeros((2, 4)), "key": jax.random.key(0), "n": jnp.int32(0), "empty": jnp.zeros((3, 0))})
    with pytest.raises(CheckpointError, match="holds 3 arrays but the training state has 1"):
        ck.restore({"w": jnp.zeros((2, 3))})
    # corrupt the newest step: clear error naming the fix; the older step stays restorable
    for f in (tmp_path / "ck" / "3").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"corrupt: unreadable.*delete .*3 to resume from step 2"):
        ck.restore(_state())
    step, restored = ck.restore(_state(), step=2)
    assert step == 2 and int(restored["n"]) == 2
