"""Negotiation text interface (``envs.games.text.GameText``): ``\\boxed{accept}``, ``\\boxed{deny}`` or an
offer ``\\boxed{give 2 wood for 3 gold}``."""

from __future__ import annotations

import jax.numpy as jnp

from jaxrl_reason.envs.games.negotiation.rules import RESOURCE_NAMES, Negotiation
from jaxrl_reason.envs.games.text import GameText, Slot, Template, check_style


def _n(values, width=1) -> tuple[str, ...]:
    return tuple(str(v).rjust(width) for v in values)


class NegotiationText(GameText):
    def __init__(self, env: Negotiation, style: str = "verbose"):
        q = env.max_qty
        self.action_strings = ("accept", "deny") + tuple(
            f"give {g} {RESOURCE_NAMES[r]} for {w} {RESOURCE_NAMES[1 - r]}"
            for r in range(2) for g in range(1, q + 1) for w in range(1, q + 1)
        )
        inv = _n(range(2 * env.initial_amount + 1), 2)
        offers = ("none.",) + tuple(
            f"{who} give{'s' if who != 'you' else ''} {g} {RESOURCE_NAMES[r]} for {w} {RESOURCE_NAMES[1 - r]}."
            for who in ("you", "opponent") for r in range(2) for g in range(1, q + 1) for w in range(1, q + 1)
        )
        turn = Slot("turn", _n(range(1, env.max_turns + 2), 2))
        if check_style(style) == "compact":
            short = ("none.",) + tuple(o.replace("opponent gives", "they give") for o in offers[1:])
            self.template = Template([
                "Negotiation. You are P", Slot("player", ("0", "1")), ", turn ", turn, "/", str(env.max_turns),
                ".\nValues: wood ", Slot("vw", _n(range(7))), ", gold ", Slot("vg", _n(range(7))),
                ".\nYou ", Slot("w0", inv), " wood ", Slot("g0", inv), " gold; opp ", Slot("w1", inv),
                " wood ", Slot("g1", inv), " gold.\nOffer: ", Slot("offer", short),
                f"\n\\boxed{{accept|deny|give G wood for W gold|give G gold for W wood}}, G, W in 1..{q}.\n",
            ])
        else:
            self.template = Template([
                "Negotiation. Trade wood and gold; after ", str(env.max_turns), " turns the player whose "
                "inventory value grew more wins.\nYou are Player ", Slot("player", ("0", "1")),
                ". Turn ", turn, " of ", str(env.max_turns),
                ".\nYour private values: wood ", Slot("vw", _n(range(7))), ", gold ", Slot("vg", _n(range(7))),
                ".\nYou hold ", Slot("w0", inv), " wood and ", Slot("g0", inv), " gold; the opponent holds ",
                Slot("w1", inv), " wood and ", Slot("g1", inv), " gold.\nPending offer: ", Slot("offer", offers),
                "\nActions: \\boxed{accept} (a pending offer from the opponent), \\boxed{deny}, or "
                f"\\boxed{{give G wood for W gold}} / \\boxed{{give G gold for W wood}} with G, W in 1..{q}.\n",
            ])
        super().__init__(env)

    def slot_values(self, state, player):
        me = jnp.arange(2) == player
        mine = jnp.where(me[:, None], state.inventory, 0).sum(0)
        theirs = jnp.where(me[:, None], 0, state.inventory).sum(0)
        vals = jnp.where(me[:, None], state.values, 0).sum(0)
        n_off = self.env.num_offers
        offer = jnp.where(
            state.pending >= 0, 1 + state.pending + jnp.where(state.proposer == player, 0, n_off), 0
        )
        return {
            "player": player, "turn": jnp.minimum(state.turn, self.env.max_turns),
            "vw": vals[0], "vg": vals[1], "w0": mine[0], "g0": mine[1], "w1": theirs[0], "g1": theirs[1],
            "offer": offer,
        }
