"""Check a (multi-process) JAX set-up: a cross-process all-reduce and one sharded train step.

    python -m jaxrl_reason.parallel.selftest --coordinator HOST:PORT --num-processes N --process-id I

Prints one JSON line with the all-reduce result, the largest difference between the sharded train
step and the same step computed on one local device, and the agreement helpers' results (a job run
by process 0 alone, its error raised on every process, a split batch gathered on every host).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_reason.parallel import distributed, mesh as mesh_lib


def _loss(params, batch):
    pred = jnp.tanh(batch["x"] @ params["w1"]) @ params["w2"]
    return jnp.mean(jnp.square(pred - batch["y"]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int)
    ap.add_argument("--process-id", type=int)
    args = ap.parse_args(argv)
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)

    n_proc, pid = jax.process_count(), jax.process_index()
    mesh = mesh_lib.make_mesh("data=-1")
    data_sh = NamedSharding(mesh, P("data"))
    # all-reduce: every process contributes (pid + 1) per local device
    local = np.full((jax.local_device_count(),), pid + 1, np.float32)
    glob = jax.make_array_from_process_local_data(data_sh, local, (jax.device_count(),))
    total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(glob))
    expected = float(sum((p + 1) * jax.local_device_count() for p in range(n_proc)))

    # one data-parallel train step vs the same step on one local device
    rng = np.random.default_rng(0)
    batch_size = 4 * jax.device_count()
    full = {"x": rng.normal(size=(batch_size, 8)).astype(np.float32),
            "y": rng.normal(size=(batch_size, 1)).astype(np.float32)}
    params = {"w1": rng.normal(size=(8, 16)).astype(np.float32) * 0.3,
              "w2": rng.normal(size=(16, 1)).astype(np.float32) * 0.3}
    opt = optax.adam(1e-2)
    specs = mesh_lib.match_partition_rules([], params)
    opt_specs = mesh_lib.match_partition_rules([], opt.init(params))
    step = mesh_lib.make_sharded_train_step(_loss, opt, mesh, specs, opt_specs)
    per = batch_size // n_proc
    local_batch = jax.tree.map(lambda a: a[pid * per:(pid + 1) * per], full)
    batch = jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(data_sh, a, (batch_size, *a.shape[1:])), local_batch
    )
    rep = mesh_lib.shard_pytree(params, mesh, specs)
    new_params, _, loss = step(rep, mesh_lib.shard_pytree(opt.init(params), mesh, opt_specs), batch)

    with jax.default_device(jax.local_devices()[0]):
        ref_loss, grads = jax.value_and_grad(_loss)(params, full)
        upd, _ = opt.update(grads, opt.init(params), params)
        ref_params = optax.apply_updates(params, upd)
    diff = max(
        float(np.max(np.abs(np.asarray(a.addressable_data(0)) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(ref_params))
    )
    # agreement: process 0 alone runs a job; the others get its result, or its error
    ran_on = distributed.on_primary(lambda: {"process": jax.process_index()})

    def fail():
        raise ValueError(f"raised by process {jax.process_index()}")

    try:
        distributed.on_primary(fail, errors=(ValueError,))
        error = None
    except ValueError as err:
        error = f"{type(err).__name__}: {err}"
    whole = distributed.gathered({"batch": batch["x"]})["batch"]  # split over every process's devices

    result = {
        "process": pid, "processes": n_proc, "devices": jax.device_count(),
        "on_primary": ran_on, "on_primary_error": error,
        "gathered_batch_exact": bool(np.array_equal(np.asarray(whole), full["x"])),
        "allreduce": total, "allreduce_expected": expected,
        "loss": float(loss), "ref_loss": float(ref_loss), "max_param_diff": diff,
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
