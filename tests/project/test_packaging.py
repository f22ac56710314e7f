"""A non-editable install ships the experiments: the wheel holds them and its CLI lists and loads them."""

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_the_experiments_and_its_cli_lists_them(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(REPO)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel, = (tmp_path / "dist").glob("jaxrl_reason-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "jaxrl_reason/experiments/grpo.py" in names and "jaxrl_reason/experiments/ppo_catch.py" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    # the unpacked wheel first on the path, outside the clone: what a `pip install jaxrl_reason` imports
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    env.pop("JAXRL_REASON_EXPERIMENTS", None)
    code = ("import jaxrl_reason.cli as c, sys; print(c.__file__); c.main(['list']); "
            "m = c.load_experiment('ppo_catch'); print('loaded', sorted(m.PRESETS))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(str(tmp_path / "site"))  # not the clone's package
    assert "grpo " in out.stdout and "loaded ['cpu', 'gpu']" in out.stdout
