"""rl/lm/logp.py: ``trainable_rows_only`` (rows with no trained token cost nothing). ``lm_logp_fn`` and the remat
choices are exercised through the learner (test_learner.py) and the trainers."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.rl.lm import Rollout, trainable_rows_only


def test_trainable_rows_only_skips_chunks_without_a_trained_row():
    """Chunks of rows, the trained ones first: the same log-probs and gradient on trained rows, zeros elsewhere,
    and a chunk with no trained row never runs (forward or backward)."""
    runs = []
    count = lambda n: runs.append(int(n))

    def logp_fn(w, rest, rows):  # a toy "model": per-token log-prob w * token id
        jax.debug.callback(count, rows.seqs.shape[0])
        return w * rows.seqs[:, -3:].astype(jnp.float32), None

    rng = np.random.default_rng(0)
    seqs = jnp.asarray(rng.integers(1, 9, (7, 5)), jnp.int32)
    mask = jnp.asarray([[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1]], jnp.float32)
    rows = Rollout(seqs, jnp.full((7,), 2, jnp.int32), mask, jnp.zeros((7,)))
    loss = lambda f: (lambda w: jnp.sum(f(w, None, rows)[0] * mask))
    chunked = trainable_rows_only(logp_fn, 2)
    got, want = jax.jit(lambda w: chunked(w, None, rows)[0])(1.5), 1.5 * seqs[:, -3:]
    trained = np.asarray(mask.sum(1) > 0)
    np.testing.assert_allclose(np.asarray(got)[trained], np.asarray(want)[trained])
    # sorted rows 0 3 | 6 1 | 2 4 | 5 -: the last two chunks hold no trained row and are not run
    assert (np.asarray(got)[[2, 4, 5]] == 0).all() and (np.asarray(got)[1] != 0).all()
    ref = jax.grad(loss(logp_fn))(1.5)
    runs.clear()
    np.testing.assert_allclose(jax.jit(jax.grad(loss(chunked)))(1.5), ref, rtol=1e-6)
    assert runs and set(runs) == {2} and len(runs) == 2 * 2  # rows 0, 3, 6 -> 2 chunks of 2, forward + backward
