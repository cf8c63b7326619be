"""How algorithm families and add-ons plug in: their interfaces and the registry of names.

An :class:`AlgorithmFamily` is what a recipe's ``algorithm = "<name>"`` needs (its recipe table,
networks, training callbacks, acting agent and ONNX graph); an :class:`AddOn` is what
``addons = ["<name>"]`` adds to it. Both register by name (:func:`register_algorithm`,
:func:`register_addon`); a name nobody registered is looked up in the ``emote.algorithms`` /
``emote.addons`` entry-point groups. The assembly code asks only this registry.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from emote_core.errors import ConfigurationError

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from emote_core.callback import Callback
    from emote_core.onnx.graph import PolicyGraph
    from emote_core.spaces import MDPSpace

log = logging.getLogger(__name__)

ALGORITHM_ENTRY_POINTS = "emote.algorithms"
"""The entry-point group other packages list their algorithm modules in."""
ADDON_ENTRY_POINTS = "emote.addons"
"""The entry-point group other packages list their add-on modules in."""


@dataclass(frozen=True)
class BuildContext:
    """What an algorithm or add-on is built for.

    Attributes:
        spaces: The environment's MDP space, as the agents see it.
        device: Where the networks live.
        seed: The recipe's seed (networks are initialised after ``torch.manual_seed(seed)``).
        rollout_length: Transitions per sampled window (n-step targets when above 1).
        batch_size: Windows per training batch.
        env_id: The environment's id, for messages.
        table: The replay table while training (``None`` when only acting), for add-ons that
            read or relabel memory.
    """

    spaces: MDPSpace
    device: torch.device
    seed: int = 0
    rollout_length: int = 1
    batch_size: int = 256
    env_id: str = ""
    table: Any = None


class Networks(ABC):
    """The networks of one algorithm; each family defines its own (usually a dataclass)."""

    observation_normalizer: nn.Module | None = None
    """The run's one observation normaliser, set by the assembly when the recipe's
    ``env.normalize_observations`` is on (``None`` otherwise): agents, training batches and
    exports pass observations through it before any of the family's networks read them, so
    families build their networks for normalised observations without knowing it."""

    @property
    @abstractmethod
    def acting(self) -> nn.Module:
        """The network agents act with, and that an ONNX export holds."""

    @property
    def image_encoder(self) -> tuple[str, nn.Module] | None:
        """The observation entry and the encoder that reads it as an image, for add-ons that
        train image representations (``curl``); ``None`` (this default) when the networks read
        no images through an encoder of their own."""
        return None

    def policy_actions(
        self, observation: Mapping[str, Tensor], *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Actions the policy as it is now samples for a batch of observations, ``(B, ...)``
        without gradients: for add-ons that judge the current policy (action symmetry).

        Args:
            observation: ``{key: (B, ...)}`` as the training batch holds it.
            generator: A CPU generator for the sampling noise (the global one when ``None``).

        Raises:
            ConfigurationError: If the family cannot sample its policy this way (this default).
        """
        raise ConfigurationError(
            f"{type(self).__name__} cannot sample its policy's actions for an add-on"
        )


@dataclass
class TrainingParts:
    """What an algorithm trains with.

    Attributes:
        callbacks: Losses, targets and schedules; all of them are checkpointed.
        agent: The agent proxy that collects experience while training (exploring).
        agent_factory: Builds another exploring agent acting with the same networks, given its
            own seed: for add-ons that act with the training policy beside the collector (model
            rollouts). The assembly fills it from :meth:`AlgorithmFamily.acting_agent` when the
            family leaves it out.
    """

    callbacks: list[Callback]
    agent: Any
    agent_factory: Callable[[int], Any] | None = None
    memory_wrapper: Callable[[Any], Any] | None = None
    """Wraps the memory proxy the collector adds its steps to, outermost (GenRL's latent SAC
    relabels the environment actions it took as the latent actions its table holds)."""


@dataclass(frozen=True)
class DataSource:
    """A data group an add-on trains on beside the replay memory's, sampled from a store.

    The assembly checks the store against the environment before a run directory is written
    (its observations must fit; actions are not read), reads it whole into a table of its own,
    records it in checkpoints like a ``--memory`` store, and joins a loader over that table to
    the replay memory's, so every batch holds ``{data_group: {...}}`` beside ``default``.

    Attributes:
        data_group: The batch's group the windows come under (not ``default``).
        store: The emote-memory store (a path or URL; relative paths from the working directory).
        option: The recipe key that names the store, for messages (``amp.reference``).
        batch_size: Windows per batch; ``None``: the recipe's ``memory.batch_size``.
        rollout_length: Transitions per window.
    """

    data_group: str
    store: str
    option: str
    batch_size: int | None = None
    rollout_length: int = 1


class _Plugin(ABC):
    """What algorithm families and add-ons have in common: a name and a recipe table."""

    name: ClassVar[str]
    """The registered name: the recipe's ``algorithm`` value (or ``addons`` entry) and the name
    of its table."""
    config_class: ClassVar[type]
    """The dataclass of the recipe table ``[<name>]``."""
    summary: ClassVar[str] = ""
    """One line for listings and help."""

    def default_config(self) -> Any:
        """The table with every default (what a recipe without ``[<name>]`` gets)."""
        return self.config_class()

    def validate(self, config: Any, *, source: str) -> None:  # noqa: B027 - optional hook
        """Checks values that are well typed but make no sense (a discount above 1, say).

        Raises:
            ConfigurationError: Naming ``source``, the key and the value.
        """


class AlgorithmFamily(_Plugin):
    """A learning algorithm that plugs into recipes, training, evaluation, collection and export.

    Subclasses set :attr:`name`, :attr:`config_class` and :attr:`acting_callback`, and implement
    the abstract methods; :func:`register_algorithm` makes them known.
    """

    acting_callback: ClassVar[str]
    """The name of the callback whose ``network_state_dict`` in a checkpoint is the acting
    network (the policy loss's, say): what ``emote eval`` and ``emote export onnx`` load
    (through :meth:`acting_callback_for`)."""
    offline_only: ClassVar[bool] = False
    """Trains from stores only (``emote train --memory STORE --no-live``): a model of
    demonstrations, say, that has no policy to collect with while it learns."""

    def acting_callback_for(self, spaces: MDPSpace) -> str:
        """The name of the callback whose network is the acting one in a run of ``spaces``:
        :attr:`acting_callback` (this default); a family whose acting network differs by the
        kind of actions (a policy, or a Q network acted on greedily) names it per space."""
        return self.acting_callback

    def table_spaces(self, config: Any, spaces: MDPSpace) -> MDPSpace:
        """The MDP space of what the replay table (and the run's memory export) holds: the
        environment's own object (this default), or another whose actions the family's memory
        wrapper stores (GenRL's latent actions; ``--memory`` stores of environment actions are
        then refused, even where the two spaces look alike)."""
        return spaces

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        """Refuses environments the algorithm cannot act in (discrete vs continuous actions).

        Raises:
            ConfigurationError: Naming the environment and what would fit.
        """

    @abstractmethod
    def make_networks(self, config: Any, context: BuildContext) -> Networks:
        """Fresh networks on ``context.device`` (the caller has seeded torch)."""

    @abstractmethod
    def training_parts(
        self, config: Any, networks: Networks, context: BuildContext
    ) -> TrainingParts:
        """The callbacks that train ``networks`` and the agent that collects meanwhile."""

    @abstractmethod
    def acting_agent(
        self, config: Any, networks: Networks, context: BuildContext, *, deterministic: bool
    ) -> Any:
        """An agent proxy acting with trained ``networks`` (outside training)."""

    @abstractmethod
    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        """The ONNX-exportable graph of the acting network (see :mod:`emote_core.onnx.graph`)."""


class AddOn(_Plugin):
    """Something that combines with an algorithm family in a recipe's ``addons`` list."""

    def check(
        self, config: Any, algorithm: AlgorithmFamily, spaces: MDPSpace, *, env_id: str
    ) -> None:
        """Refuses algorithms or environments the add-on (configured by its table ``config``)
        does not work with; called before anything is built or written.

        Raises:
            ConfigurationError: Naming what does not fit.
        """

    def adapt_networks(self, config: Any, networks: Networks, context: BuildContext) -> Networks:
        """Changes the algorithm's networks before its callbacks are built (also when a trained
        network is rebuilt for evaluation or export); the default keeps them."""
        return networks

    def callbacks(
        self, config: Any, networks: Networks, parts: TrainingParts, context: BuildContext
    ) -> list[Callback]:
        """Callbacks to train with beside the algorithm's (checkpointed with them)."""
        return []

    def data_sources(self, config: Any) -> list[DataSource]:
        """Data groups to train on beside the replay memory's (see :class:`DataSource`); their
        callbacks find them in the batch by group name. The default has none."""
        return []


_P = TypeVar("_P", bound=_Plugin)


class _Registry:
    """Plugins of one kind by name, thread-safe, with entry-point discovery of unknown names."""

    def __init__(self, kind: str, base: type[_Plugin], group: str) -> None:
        self.kind = kind
        self.base = base
        self.group = group
        self._plugins: dict[str, _Plugin] = {}
        self._lock = threading.RLock()
        self._loaded_entry_points: set[str] = set()

    def register(self, plugin: Any, *, replace: bool) -> Any:
        if isinstance(plugin, type) and issubclass(plugin, self.base):
            missing = sorted(getattr(plugin, "__abstractmethods__", ()))
            if missing:
                raise ConfigurationError(
                    f"{self.kind} {plugin.__qualname__} does not implement {', '.join(missing)}"
                )
            instance = plugin()
        else:
            instance = plugin
        if not isinstance(instance, self.base):
            raise ConfigurationError(
                f"{self.kind} plugins derive from {self.base.__name__}; got {type(instance)!r}"
            )
        name = getattr(instance, "name", None)
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigurationError(
                f"a {self.kind}'s name must be an identifier (it names a recipe table); got "
                f"{name!r} from {type(instance).__name__}"
            )
        config_class = getattr(instance, "config_class", None)
        if not (isinstance(config_class, type) and dataclasses.is_dataclass(config_class)):
            raise ConfigurationError(
                f"{self.kind} '{name}' needs config_class, the dataclass of its recipe table; "
                f"got {config_class!r}"
            )
        acting = getattr(instance, "acting_callback", "")
        if isinstance(instance, AlgorithmFamily) and not (isinstance(acting, str) and acting):
            raise ConfigurationError(
                f"algorithm '{name}' needs acting_callback, the name of the callback whose "
                f"network is the acting network in checkpoints; got {acting!r}"
            )
        with self._lock:
            held = self._plugins.get(name)
            if held is not None and not replace and type(held) is not type(instance):
                raise ConfigurationError(
                    f"{self.kind} '{name}' is already registered by {type(held).__qualname__}; "
                    "choose another name or pass replace=True"
                )
            self._plugins[name] = instance
        return plugin

    def unregister(self, name: str) -> None:
        with self._lock:
            self._plugins.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._plugins)

    def find(self, name: str) -> _Plugin | None:
        with self._lock:
            found = self._plugins.get(name)
        if found is None and self._load_entry_points():
            with self._lock:
                found = self._plugins.get(name)
        return found

    def get(self, name: str) -> _Plugin:
        found = self.find(name)
        if found is None:
            known = self.names()
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigurationError(
                f"no {self.kind} named '{name}'{hint} (registered: {', '.join(known) or 'none'}; "
                f"packages add theirs through the '{self.group}' entry points)"
            )
        return found

    def _load_entry_points(self) -> bool:
        """Imports the group's entry points not imported yet; whether any was."""
        loaded = False
        for entry in metadata.entry_points(group=self.group):
            with self._lock:
                if entry.value in self._loaded_entry_points:
                    continue
                self._loaded_entry_points.add(entry.value)
            try:
                target = entry.load()
            except Exception as error:  # a broken third-party plugin must not hide the others
                log.warning("cannot load %s entry point '%s': %s", self.group, entry.value, error)
                continue
            if (isinstance(target, type) and issubclass(target, self.base)) or isinstance(
                target, self.base
            ):
                self.register(target, replace=False)
            loaded = True
        return loaded


_ALGORITHMS = _Registry("algorithm", AlgorithmFamily, ALGORITHM_ENTRY_POINTS)
_ADDONS = _Registry("add-on", AddOn, ADDON_ENTRY_POINTS)


def register_algorithm(family: _P | type[_P], *, replace: bool = False) -> Any:
    """Makes an algorithm family known by its ``name``; usable as a class decorator.

    Args:
        family: An :class:`AlgorithmFamily` subclass (instantiated without arguments) or instance.
        replace: Replace a different family registered under the same name.

    Returns:
        ``family``, unchanged.

    Raises:
        ConfigurationError: If it is not a family, its name is not an identifier, it has no
            config dataclass, or the name is taken.
    """
    return _ALGORITHMS.register(family, replace=replace)


def register_addon(addon: _P | type[_P], *, replace: bool = False) -> Any:
    """Makes an add-on known by its ``name``; usable as a class decorator (see
    :func:`register_algorithm`)."""
    return _ADDONS.register(addon, replace=replace)


def unregister_algorithm(name: str) -> None:
    """Forgets an algorithm family (no error when it is not registered)."""
    _ALGORITHMS.unregister(name)


def unregister_addon(name: str) -> None:
    """Forgets an add-on (no error when it is not registered)."""
    _ADDONS.unregister(name)


def get_algorithm(name: str) -> AlgorithmFamily:
    """The algorithm family registered as ``name``.

    Raises:
        ConfigurationError: If there is none, with the closest registered name.
    """
    return _ALGORITHMS.get(name)  # type: ignore[return-value]


def get_addon(name: str) -> AddOn:
    """The add-on registered as ``name``.

    Raises:
        ConfigurationError: If there is none, with the closest registered name.
    """
    return _ADDONS.get(name)  # type: ignore[return-value]


def find_plugin(name: str) -> AlgorithmFamily | AddOn | None:
    """The algorithm family or add-on whose table is ``[name]``, or ``None``."""
    return _ALGORITHMS.find(name) or _ADDONS.find(name)  # type: ignore[return-value]


def discover() -> None:
    """Imports every algorithm and add-on that installed packages list in their entry points
    (lookups do this by themselves for names they do not know; listings call this first)."""
    _ALGORITHMS._load_entry_points()
    _ADDONS._load_entry_points()


def algorithm_names() -> list[str]:
    """The registered algorithm families, sorted."""
    return _ALGORITHMS.names()


def addon_names() -> list[str]:
    """The registered add-ons, sorted."""
    return _ADDONS.names()


__all__ = [
    "ADDON_ENTRY_POINTS",
    "ALGORITHM_ENTRY_POINTS",
    "AddOn",
    "AlgorithmFamily",
    "BuildContext",
    "DataSource",
    "Networks",
    "TrainingParts",
    "addon_names",
    "algorithm_names",
    "discover",
    "find_plugin",
    "get_addon",
    "get_algorithm",
    "register_addon",
    "register_algorithm",
    "unregister_addon",
    "unregister_algorithm",
]
