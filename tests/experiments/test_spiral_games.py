"""experiments/spiral_games.py at a tiny size: AlphaZero on TicTacToe, PPO self-play (RAE and none) on Kuhn Poker
and Simple Negotiation, each reporting finite figures."""

import math

import pytest

from jaxrl_reason.cli import run_experiment


@pytest.mark.slow
def test_tiny_run_reports_every_game(tmp_path):
    s = run_experiment("spiral_games", [
        "--run-root", str(tmp_path), "--logger", "none", "--tictactoe.num-envs", "4", "--tictactoe.num-steps", "4",
        "--tictactoe.num-simulations", "2", "--tictactoe.max-num-considered-actions", "2", "--tictactoe.hidden", "8",
        "--tictactoe.minibatch-size", "8", "--tictactoe.sgd-steps", "1", "--tictactoe.num-iterations", "1",
        "--ttt-eval-games", "2", "--ttt-curve-games", "2", "--ttt-eval-simulations", "2", "--kuhn.num-envs", "4",
        "--kuhn.num-updates", "1", "--kuhn.hidden", "8", "--negotiation.num-envs", "4", "--negotiation.num-updates",
        "1", "--negotiation.hidden", "8", "--neg-eval-games", "2"])
    for adv in ("rae", "none"):
        assert 0 <= s[f"kuhn_{adv}_exploitability_current"] and 0 <= s[f"kuhn_{adv}_exploitability_average"], s
        assert math.isfinite(s[f"negotiation_{adv}_mean_return"]), s
    outcomes = [v for k, v in s.items() if k.startswith("ttt_vs_")]
    assert len(outcomes) == 8 and all(0 <= v <= 1 for v in outcomes), s
