"""The plug-in protocol of the training loop: ``StepContext`` and ``Plugin`` (the hooks and their
order are described in ``zfree.train.plugins``, which holds the registry). A light module of the objective
layer (no torch), so a plug-in can be declared in its own file in the train layer
(``zfree.train.word_dropout``) or as the hook of a remedy entry (``zfree.objective.remedies.Remedy.plugin``)
without importing the registry that lists it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # light: the protocol names these types only
    from zfree.config import TrainConfig
    from zfree.objective.objectives import Phase


@dataclass
class StepContext:
    """What a hook sees of the running loop: the run (``zfree_lab.run.run_setup.Run``: model, data, optimizer,
    numpy RNG, state), the config, the step number (1-based), the step's objective (host batch ->
    breakdown), the frozen-side mask (``aids.FrozenDecoderMask``), the finite-loss watch and the
    gate rows (``zfree_lab.run.run_data.RunData.gate``: never evaluation rows)."""

    run: Any
    cfg: TrainConfig
    step: int
    objective: Callable | None = None
    mask: Any = None
    watch: Any = None
    gate_rows: Sequence = ()
    update: Callable | None = None  # (ctx, rows, side) -> loss: one extra update on rows (inner loops)


class Plugin:
    """A training-loop plug-in; every hook is a no-op until a subclass defines it."""

    #: its name in ``PLUGINS``
    name: str = ""
    #: the flat config fields it reads (documentation and the tests' coverage check)
    fields: tuple[str, ...] = ()
    #: the ``TrainState`` fields it owns (checkpointed with the state)
    owns: tuple[str, ...] = ()
    #: the paper (and equation or section) its rule comes from
    source: str = ""

    def active(self, cfg: TrainConfig) -> bool:
        """Whether this run uses the plug-in."""
        return False

    def initial_phase(self, cfg: TrainConfig) -> Phase | None:
        """The phase a fresh run starts in, or None to leave it to another plug-in (default soft)."""
        return None

    def rates(self, cfg: TrainConfig, state, step: int, rates: dict[str, float]) -> dict[str, float]:
        """The step's learning rates by param-group name; returns ``rates`` (changed or not)."""
        return rates

    def objective_kw(self, cfg: TrainConfig, state, step: int) -> dict[str, Any]:
        """Keyword arguments of the step's objective (``objectives.step_objective``)."""
        return {}

    def rows(self, ctx: StepContext, rows: list) -> list:
        """The step's encoded rows (``EncodedPair``) as the step trains on them."""
        return rows

    def before_update(self, ctx: StepContext, rows: list) -> None:
        """Work before the step's forward pass (extra updates through ``ctx.update``)."""

    def after_forward(self, ctx: StepContext, br) -> None:
        """Read the step's objective breakdown before the update."""

    def trained_side(self, cfg: TrainConfig, state, step: int) -> str:
        """Which parameters the step's update changes: "all", "posterior" or "decoder"."""
        return "all"

    def after_update(self, ctx: StepContext) -> None:
        """Checks after the step's update (``ctx.run.state.step`` is the step just taken)."""

    def summary(self, cfg: TrainConfig, state) -> dict[str, Any]:
        """Keys this plug-in adds to summary.json."""
        return {}
