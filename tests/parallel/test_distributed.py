"""Two local CPU processes (gloo collectives): all-reduce and one sharded train step."""

import json
import os
import socket
import subprocess
import sys

import pytest
from testutil import subprocess_xla_flags


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_allreduce_and_sharded_step():
    port = _free_port()
    env = {**os.environ, "XLA_FLAGS": subprocess_xla_flags(2), "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jaxrl_reason.parallel.selftest", "--coordinator", f"127.0.0.1:{port}",
             "--num-processes", "2", "--process-id", str(i)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for i in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads([l for l in out.splitlines() if l.startswith("{")][-1]))
    for r in results:
        assert r["processes"] == 2 and r["devices"] == 4
        assert r["allreduce"] == r["allreduce_expected"] == 6.0
        assert abs(r["loss"] - r["ref_loss"]) < 1e-5
        assert r["max_param_diff"] < 1e-5
        assert r["on_primary"] == {"process": 0} and r["on_primary_error"] == "ValueError: raised by process 0"
        assert r["gathered_batch_exact"]


def test_initialize_is_a_noop_for_one_process_and_checks_args(monkeypatch):
    from jaxrl_reason.parallel import distributed

    for v in ("JAXRL_COORDINATOR", "JAX_COORDINATOR_ADDRESS", "JAXRL_NUM_PROCESSES", "JAX_NUM_PROCESSES"):
        monkeypatch.delenv(v, raising=False)
    assert distributed.initialize() is False
    assert distributed.initialize(num_processes=1) is False
    with pytest.raises(ValueError, match="JAXRL_PROCESS_ID"):
        distributed.initialize(coordinator="127.0.0.1:1234", num_processes=2)
    with pytest.raises(ValueError, match="process id 5"):
        distributed.initialize(coordinator="127.0.0.1:1234", num_processes=2, process_id=5)
