"""experiments/bench_scaling.py: one process vs two (gloo collectives) on the same global work."""

import pytest
from conftest import FAST_COMPILE_FLAGS

from jaxrl_reason.cli import load_experiment, run_experiment


@pytest.mark.slow
def test_two_processes_step_the_same_environments_as_one(tmp_path):
    config = load_experiment("bench_scaling").PRESETS["cpu"]
    s = run_experiment("bench_scaling", ["--preset", "cpu", "--run-root", str(tmp_path),
                                         f"--xla-flags={FAST_COMPILE_FLAGS}"])
    assert s["devices[1 process]"] == [(1, 2, 2)]
    assert s["devices[2 processes]"] == [(2, 4, 2), (2, 4, 2)]
    for w in ("env", "lm"):
        assert s[f"{w}_per_s[1 process]"] > 0 and s[f"{w}_per_s[2 processes]"] > 0 and s[f"{w}_ratio"] > 0
    # the split is right: per-environment episodes, rewards and observations of every round hash alike
    one, two = s["env_checks[1 process]"], s["env_checks[2 processes]"]
    assert len(one) == config.rounds and one == two
    assert all(c["episodes"] > 0 and c["abs_obs"] > 0 for c in one)
    assert len({c["digest"] for c in one}) == config.rounds  # each round its own key
    # no stop token: every prompt of the global batch samples new_tokens tokens in both arms
    for arm in ("1 process", "2 processes"):
        assert [c["tokens"] for c in s[f"lm_checks[{arm}]"]] == [config.lm_batch * config.new_tokens] * config.rounds


def test_config_checks_the_global_batches_divide():
    bs = load_experiment("bench_scaling")
    with pytest.raises(ValueError, match="multiples"):
        bs.Config(env_batch=6)
    with pytest.raises(ValueError, match="max_seq_len"):
        bs.Config(prompt_len=100, new_tokens=100)
