"""TicTacToe text interface (``envs.games.text.GameText``): a move answers ``\\boxed{n}`` (cell ``0..8``)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxrl_reason.envs.games.text import GameText, Slot, Template, check_style
from jaxrl_reason.envs.games.tictactoe.rules import TicTacToe, bits_to_cells


class TicTacToeText(GameText):
    action_strings = tuple(str(c) for c in range(9))

    def __init__(self, env: TicTacToe, style: str = "verbose"):
        cell = lambda i: Slot(f"cell{i}", (str(i), "X", "O"))
        legal = [Slot(f"legal{i}", ("  ", f" {i}")) for i in range(9)]
        if check_style(style) == "compact":
            parts: list = ["TicTacToe. You are ", Slot("mark", ("X", "O")), ".\n"]
            for r in range(3):
                parts += [cell(3 * r + c) for c in range(3)] + ["\n"]
            parts += ["Legal:", *legal, "\nAnswer \\boxed{n}.\n"]
        else:
            parts = ["Tic-Tac-Toe on a 3x3 board. You play ", Slot("mark", ("X", "O")),
                     " (X moves first). Three in a row wins.\nBoard (free cells show their number):\n"]
            for r in range(3):
                for c in range(3):
                    parts += [" ", cell(3 * r + c), " " if c == 2 else " |"]
                parts.append("\n" if r == 2 else "\n---+---+---\n")
            parts += ["Legal moves:", *legal, "\nYour move. Answer with the cell number as \\boxed{n}.\n"]
        self.template = Template(parts)
        super().__init__(env)

    def slot_values(self, state, player):
        cells = bits_to_cells(state.marks)  # [2, 9]
        x_player = state.first_player
        x_cells = jnp.where(x_player == 0, cells[0], cells[1])
        o_cells = jnp.where(x_player == 0, cells[1], cells[0])
        vals = {"mark": (player != x_player).astype(jnp.int32)}
        empty = ~(x_cells | o_cells)
        for i in range(9):
            vals[f"cell{i}"] = jnp.where(x_cells[i], 1, jnp.where(o_cells[i], 2, 0))
            vals[f"legal{i}"] = (empty[i] & ~state.terminated).astype(jnp.int32)
        return vals
