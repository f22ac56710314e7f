"""Scaling on CPU processes: ``processes`` processes with ``devices_per_process`` host devices each vs one
process with ``devices_per_process`` devices, on the same global work: env steps/s and sampled tokens/s.

Each arm is a group of worker processes (this script with ``--worker``; XLA_FLAGS gives each its host
devices, JAX_PLATFORMS=cpu; the multi-process arm joins one ``jax.distributed`` job over gloo, as
``parallel/selftest.py``) that builds a ``data`` mesh over all the job's devices and compiles two workloads:

- env: ``batch_step`` of ``envs.AutoReset(envs.make(env))`` under a jitted ``lax.scan`` of ``env_steps``,
  uniformly random legal actions, ``env_batch`` environments sharded over ``data`` (every process steps its
  own rows; the per-environment sums are gathered once at the end): env steps/s = env_batch * env_steps /
  seconds. Those sums (episodes ended, rewards of agent 0, |observations|) hash alike in both arms when the
  split is right (``digest``);
- lm: the GRPO sampler (``models.lm.sampler.generate_data_parallel``: one decode loop per device on its rows,
  weights replicated) on a tiny random ``recipes.TinyLM``, ``lm_batch`` prompts sharded over ``data``:
  sampled tokens/s = generated tokens (no stop token: lm_batch * new_tokens) / seconds.

Both arms start at once and compile (untimed); then ``rounds`` rounds drive them in turn (one arm runs while
the other waits on its pipe; the first arm alternates), and the medians give the ratio processes / one
process per workload. A call's time is the slowest process's. On a shared CPU the figure is what the
machine gives, not necessarily ``processes``x: the multi-process arm has more devices on the same cores.

    python experiments/bench_scaling.py --preset cpu       # tiny (the test)
    python experiments/bench_scaling.py --preset default   # the results doc's figures (a few minutes)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_reason import envs
from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.models.lm.sampler import (
    SamplerConfig,
    generate_data_parallel,
    prepare,
)
from jaxrl_reason.parallel import distributed
from jaxrl_reason.parallel import mesh as mesh_lib
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.utils.experiment import RunDir, config_to_dict
from jaxrl_reason.utils.validation import check_hyperparameters

TAG = "@@bench_scaling "  # prefix of the workers' reply lines on stdout
#: a multi-process run's variables: the workers join only the job their arm describes
DISTRIBUTED_VARS = set(distributed.COORDINATOR_VARS + distributed.NUM_PROCESSES_VARS + distributed.PROCESS_ID_VARS)


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    processes: int = 2
    devices_per_process: int = 2
    env: str = "tictactoe"
    env_batch: int = 8192  # global, the same in both arms
    env_steps: int = 100
    lm: recipes.TinyLM = recipes.TinyLM(d_model=128, n_layers=2, d_ff=512, max_seq_len=144, scan_layers=False)
    vocab_size: int = 256
    lm_batch: int = 64  # global prompts, the same in both arms
    prompt_len: int = 16
    new_tokens: int = 128
    temperature: float = 1.0
    rounds: int = 7
    xla_flags: str = ""  # added to the workers' XLA_FLAGS (e.g. the test suite's fast-compile flags)
    timeout_s: float = 600.0  # a worker that does not answer within this is a failure

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.processes, self.devices_per_process) < 1 or self.processes < 2:
            raise ValueError("need processes >= 2 and devices_per_process >= 1")
        n = self.processes * self.devices_per_process
        if self.env_batch % n or self.lm_batch % n:
            raise ValueError(f"env_batch and lm_batch must be multiples of processes * devices_per_process = {n}")
        if min(self.env_steps, self.rounds, self.prompt_len, self.new_tokens) < 1:
            raise ValueError("env_steps, rounds, prompt_len, new_tokens must be >= 1")
        if self.prompt_len + self.new_tokens > self.lm.max_seq_len:
            raise ValueError(f"prompt_len + new_tokens must fit lm.max_seq_len {self.lm.max_seq_len}")


PRESETS = {
    "cpu": Config(env_batch=256, env_steps=10, lm=recipes.TinyLM(d_model=32, n_layers=1, d_ff=64, max_seq_len=24,
                                                                   scan_layers=False),
                  vocab_size=64, lm_batch=8, prompt_len=8, new_tokens=8, rounds=2),
    "default": Config(),
}


# -- worker side ------------------------------------------------------------------------------------------
def put(tree, sharding: NamedSharding):
    """Host values (the same in every process) -> global arrays with ``sharding``."""
    return jax.tree.map(lambda x: jax.make_array_from_callback(np.shape(x), sharding,
                                                               lambda idx, x=np.asarray(x): x[idx]), tree)


def workloads(c: dict, mesh: Mesh) -> dict[str, Callable[[int], dict]]:
    """``{"env": f, "lm": f}``: ``f(round)`` runs one jitted call over ``mesh``'s ``data`` axis (``c``: the
    config as a dict) and returns per-row arrays, replicated (gathered once at the end of the call)."""
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    # env rollout: every leaf with a leading batch axis stays split over `data`
    env, batch = envs.AutoReset(envs.make(c["env"])), c["env_batch"]
    split = lambda tree: jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, rows) if x.ndim and x.shape[0] == batch else x, tree)
    actions = jax.vmap(lambda k, ts: envs.random_legal_action(k, env, ts))

    def body(carry, _):
        key, state, ts, acc = carry
        key, k_act, k_step = jax.random.split(key, 3)
        state, ts = split(env.batch_step(k_step, state, actions(split(jax.random.split(k_act, batch)), ts)))
        obs = jnp.abs(ts.obs.reshape(batch, -1).astype(jnp.float32)).sum(-1)
        acc = split((acc[0] + ts.done, acc[1] + ts.reward.reshape(batch, -1)[:, 0], acc[2] + obs))
        return (key, state, ts, acc), None

    @functools.partial(jax.jit, out_shardings=replicated)  # per-environment sums, gathered once at the end
    def env_rollout(seed):
        key = jax.random.key(seed)
        state, ts = split(env.batch_reset(key, batch))
        acc = split((jnp.zeros(batch, jnp.int32), jnp.zeros(batch, jnp.float32), jnp.zeros(batch, jnp.float32)))
        (_, _, _, acc), _ = jax.lax.scan(body, (key, state, ts, acc), None, c["env_steps"])
        return dict(zip(("episodes", "reward", "abs_obs"), acc))

    # LM sampling: the same random model and prompts in every process (seeded)
    lm = recipes.TinyLM(**c["lm"])
    model = Transformer(lm.config(c["vocab_size"]), rngs=nnx.Rngs(c["seed"]))
    graphdef, params = nnx.split(model)
    scfg = SamplerConfig(max_new_tokens=c["new_tokens"], temperature=c["temperature"])
    prompts = np.random.default_rng(c["seed"]).integers(1, c["vocab_size"], (c["lm_batch"], c["prompt_len"]))
    args = put(tuple(np.asarray(a) for a in prepare(model.cfg, prompts, None, scfg)), rows)
    params = put(params, replicated)

    @functools.partial(jax.jit, out_shardings=replicated)
    def lm_sample(params, args, seed):
        out = generate_data_parallel(graphdef, params, *args[:2], jax.random.key(seed), *args[2:], config=scfg,
                                     mesh=mesh)
        return {"tokens": out.lengths, "sampled": out.tokens}

    seed = lambda i: put(np.int32(c["seed"] + i), replicated)
    return {"env": lambda i: env_rollout(seed(i)), "lm": lambda i: lm_sample(params, args, seed(i))}


def _worker(spec: dict) -> None:
    """One process of an arm: compile both workloads, then answer ``{"cmd": "env"|"lm", "round": i}`` lines on
    stdin with one reply line each (seconds, sums and a digest of the per-row values), until ``{"cmd": "quit"}``."""
    if spec["processes"] > 1:
        distributed.initialize(spec["coordinator"], spec["processes"], spec["process_id"], cpu=True)
    calls = workloads(spec["config"], mesh_lib.make_mesh("data=-1"))

    def reply(**msg):
        print(TAG + json.dumps(msg), flush=True)

    for f in calls.values():  # compile and warm up
        jax.block_until_ready(f(0))
    reply(ready=True, processes=jax.process_count(), devices=jax.device_count(),
          local_devices=jax.local_device_count())
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        t = time.perf_counter()
        out = jax.block_until_ready(calls[cmd["cmd"]](cmd["round"]))
        seconds = time.perf_counter() - t
        out = {k: np.asarray(v) for k, v in out.items()}
        # per-row values hash alike whatever the split (no cross-row sums in another order)
        digest = hashlib.sha256(b"".join(v.tobytes() for v in out.values())).hexdigest()[:16]
        reply(seconds=seconds, digest=digest, **{k: v.sum(dtype=np.float64).item() for k, v in out.items()})


# -- parent side ------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Arm:
    """A group of worker processes (one ``jax.distributed`` job when more than one), driven by commands."""

    def __init__(self, name: str, processes: int, config: Config, run_dir: RunDir):
        self.name, self.timeout = name, config.timeout_s
        inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
        env = {**inherited, "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={config.devices_per_process} {config.xla_flags}"}
        coordinator = f"127.0.0.1:{_free_port()}"
        self.procs, self.replies, self.logs = [], [], []
        for pid in range(processes):
            spec = {"config": config_to_dict(config), "processes": processes, "process_id": pid,
                    "coordinator": coordinator}
            log = run_dir.path / f"worker_{name.replace(' ', '_')}_{pid}.log"
            self.logs.append(log)
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                                 env=env)
            q: queue.Queue = queue.Queue()
            threading.Thread(target=self._read, args=(p, q), daemon=True).start()
            self.procs.append(p)
            self.replies.append(q)

    @staticmethod
    def _read(p: subprocess.Popen, q: queue.Queue) -> None:
        for line in p.stdout:
            if line.startswith(TAG):
                q.put(json.loads(line[len(TAG):]))
        q.put(None)  # the process closed its stdout (exited)

    def collect(self) -> list[dict]:
        """One reply from every process (a failure names the worker and the tail of its log)."""
        out = []
        for pid, q in enumerate(self.replies):
            try:
                msg = q.get(timeout=self.timeout)
            except queue.Empty:
                msg = None
            if msg is None:
                self.close()
                tail = self.logs[pid].read_text()[-3000:]
                raise RuntimeError(f"bench_scaling: worker {pid} of arm {self.name!r} gave no answer; its log:\n{tail}")
            out.append(msg)
        return out

    def call(self, cmd: str, round_: int) -> list[dict]:
        for p in self.procs:
            p.stdin.write(json.dumps({"cmd": cmd, "round": round_}) + "\n")
            p.stdin.flush()
        return self.collect()

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                    p.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run(config: Config, run_dir: RunDir) -> dict:
    arms = {"1 process": 1, f"{config.processes} processes": config.processes}
    work = {"env": ("env steps/s", config.env_batch * config.env_steps), "lm": ("sampled tokens/s", None)}
    started = {}
    try:
        for name, n in arms.items():  # both start (and compile) at once; nothing is timed yet
            started[name] = Arm(name, n, config, run_dir)
        ready = {name: arm.collect() for name, arm in started.items()}
        for name, r in ready.items():
            print(f"[bench_scaling] {name}: {r[0]['processes']} process(es), {r[0]['devices']} devices", flush=True)
        calls = {(name, w): [] for name in arms for w in work}
        for i in range(1, config.rounds + 1):
            order = list(arms) if i % 2 else list(arms)[::-1]
            for w in work:
                for name in order:  # one arm at a time: the other waits on its pipe
                    calls[name, w].append(started[name].call(w, i))
    finally:
        for arm in started.values():
            arm.close()
    rows, summary = [], {"rounds": config.rounds}
    for name, r in ready.items():
        summary[f"devices[{name}]"] = [(m["processes"], m["devices"], m["local_devices"]) for m in r]
    for w, (unit, fixed) in work.items():
        rate = {}
        for name in arms:
            seconds = [max(r["seconds"] for r in replies) for replies in calls[name, w]]
            tokens = (replies[0]["tokens"] for replies in calls[name, w])
            amount = fixed if fixed is not None else statistics.median(tokens)
            rate[name] = amount / statistics.median(seconds)
            checks = [{k: v for k, v in replies[0].items() if k != "seconds"} for replies in calls[name, w]]
            rows.append({"workload": w, "arm": name, "unit": unit, "per_s": rate[name],
                         "median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds)})
            summary[f"{w}_per_s[{name}]"] = rate[name]
            summary[f"{w}_checks[{name}]"] = checks
        one, many = (rate[name] for name in arms)
        summary[f"{w}_ratio"] = many / one
        print(f"[bench_scaling] {unit}: {list(arms)[1]} / 1 process = {many:,.0f} / {one:,.0f} = {many / one:.3f}")
    print(run_dir.write_table("bench_scaling", rows))
    return summary


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(json.loads(sys.argv[2]))
    else:
        from jaxrl_reason.cli import script_main

        script_main(__file__)
