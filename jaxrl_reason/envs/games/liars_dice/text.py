"""Liar's Dice text interface (``envs.games.text.GameText``): bids answer ``\\boxed{bid QxF}``, a call ``\\boxed{liar}``."""

from __future__ import annotations

import jax.numpy as jnp

from jaxrl_reason.envs.games.liars_dice.rules import LiarsDice
from jaxrl_reason.envs.games.text import GameText, Slot, Template, check_style


class LiarsDiceText(GameText):

    def __init__(self, env: LiarsDice, style: str = "verbose"):
        bids = tuple(f"{q}x{f}" for q in range(1, 2 * env.dice + 1) for f in range(1, env.faces + 1))
        self.action_strings = tuple(f"bid {b}" for b in bids) + ("liar",)
        faces = tuple(str(f) for f in range(1, env.faces + 1))
        dice = [p for i in range(env.dice) for p in (" ", Slot(f"die{i}", faces))]
        standing = Slot("bid", ("none",) + tuple(f"{b} by {who}" for who in ("you", "opponent") for b in bids))
        if check_style(style) == "compact":
            parts = ["Liar's Dice. You are P", Slot("player", ("0", "1")), ". Dice:", *dice, ".\nBid: ", standing,
                     ".\n\\boxed{bid QxF} (raise) or \\boxed{liar}.\n"]
        else:
            parts = [f"Liar's Dice with {env.dice} dice of {env.faces} faces per player. A bid QxF claims that at "
                     "least Q of all dice show face F; raise with more dice, or as many dice and a higher face, "
                     "or call liar: the loser of the call loses the game.\nYou are Player ",
                     Slot("player", ("0", "1")), ". Your dice:", *dice, ".\nStanding bid: ", standing,
                     ".\nAnswer \\boxed{bid QxF} or \\boxed{liar}.\n"]
        self.template = Template(parts)
        super().__init__(env)

    def slot_values(self, state, player):
        mine = jnp.where(player == 0, state.dice[0], state.dice[1])
        by_other = state.current_player == player  # the standing bid is the other player's to answer
        standing = jnp.where(state.bid < 0, 0, 1 + state.bid + jnp.where(by_other, self.env.num_bids, 0))
        vals = {"player": player, "bid": standing}
        vals.update({f"die{i}": mine[i] for i in range(self.env.dice)})
        return vals
