"""Role-conditioned Advantage Estimation (``rl.rae``): the batched update equals the sequential reference."""

import numpy as np
import pytest

from jaxrl_reason.rl.rae import rae_advantages


def test_rae_matches_sequential_reference():
    rng = np.random.default_rng(0)
    returns, games, valid = rng.normal(size=(40, 2)), rng.integers(0, 3, 40), rng.random(40) > 0.3
    b0 = rng.normal(size=(3, 2))
    adv, nb = rae_advantages(b0, returns, games, valid, alpha=0.05)
    b, ref = b0.copy(), np.zeros_like(returns)
    for i in range(40):
        if valid[i]:
            ref[i] = returns[i] - b[games[i]]  # read before the update
            b[games[i]] = 0.95 * b[games[i]] + 0.05 * returns[i]
    np.testing.assert_allclose(adv, ref, atol=1e-5)
    np.testing.assert_allclose(nb, b, atol=1e-5)
    with pytest.raises(ValueError, match="alpha"):
        rae_advantages(b0, returns, alpha=0.0)
