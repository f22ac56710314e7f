"""rl.update: one gradient step and minibatch epochs (every row visited; the wrap rule)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_reason.rl.update import gradient_step, minibatch_epochs


def _seen_rows(n, minibatches, epochs, wrap, group=1):
    """Run minibatch_epochs with a loss that records the rows of each minibatch (lr 0: params unchanged)."""
    data = {"row": jnp.arange(n)}
    loss_fn = lambda params, b: (jnp.sum(params * 0.0), {"rows": b["row"]})
    (params, _), m = minibatch_epochs(loss_fn, optax.sgd(0.0), jnp.zeros(()), optax.sgd(0.0).init(jnp.zeros(())),
                                      data, jax.random.key(0), epochs, minibatches, wrap=wrap, group=group)
    return np.asarray(m["rows"])  # [epochs, minibatches, size]


def test_each_epoch_visits_every_row_once_when_rows_divide():
    rows = _seen_rows(12, 3, epochs=2, wrap=False)
    assert rows.shape == (2, 3, 4)
    for e in range(2):
        np.testing.assert_array_equal(np.sort(rows[e].ravel()), np.arange(12))
    assert not np.array_equal(rows[0], rows[1])  # a fresh shuffle per epoch


def test_wrap_visits_every_row_and_repeats_only_the_remainder():
    rows = _seen_rows(10, 4, epochs=1, wrap=True)[0]  # ceil(10 / 4) = 3 rows per minibatch
    assert rows.shape == (4, 3)
    counts = np.bincount(rows.ravel(), minlength=10)
    assert counts.min() == 1 and counts.sum() == 12 and (counts == 2).sum() == 2


def test_groups_stay_whole_and_in_order():
    rows = _seen_rows(24, 2, epochs=2, wrap=False, group=4)  # 6 groups of 4 rows, 3 groups per minibatch
    assert rows.shape == (2, 2, 12)
    for e in range(2):
        np.testing.assert_array_equal(np.sort(rows[e].ravel()), np.arange(24))
        groups = rows[e].reshape(-1, 4)
        np.testing.assert_array_equal(groups - groups[:, :1], np.tile(np.arange(4), (6, 1)))  # consecutive rows
        assert (groups[:, 0] % 4 == 0).all()
    assert not np.array_equal(rows[0], rows[1])
    with pytest.raises(ValueError, match="groups of 4 do not split into 4 minibatches"):
        _seen_rows(24, 4, epochs=1, wrap=False, group=4)


def test_rows_that_do_not_divide_are_an_error_without_wrap():
    with pytest.raises(ValueError, match="10 rows do not split into 4 minibatches"):
        _seen_rows(10, 4, epochs=1, wrap=False)


def test_gradient_step_descends_and_reports_the_gradient_norm():
    loss_fn = lambda p, b: (jnp.sum((p - b) ** 2), {})
    opt = optax.sgd(0.1)
    (p, _), m = gradient_step(loss_fn, opt)((jnp.ones(2), opt.init(jnp.ones(2))), jnp.zeros(2))
    np.testing.assert_allclose(p, 0.8)
    np.testing.assert_allclose(m["grad_norm"], np.sqrt(8.0), rtol=1e-6)
