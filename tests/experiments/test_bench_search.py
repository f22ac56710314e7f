"""experiments/bench_search.py: its configuration errors (the benchmark itself runs in the device check's CPU
preset, tests/experiments/test_device_check.py)."""

import pytest

from jaxrl_reason.cli import load_experiment


def test_config_errors():
    bench = load_experiment("bench_search")
    with pytest.raises(ValueError, match="num_samples"):
        bench.Config(num_samples=0)
    with pytest.raises(ValueError, match="astro_preset"):
        bench.run(bench.Config(astro_preset="tpu"), None)
