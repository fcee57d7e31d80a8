"""The zoo: published, pretrained models that load offline, by name.

``available_models()`` lists them; ``load_model(name, **kwargs)`` builds one (eval mode, on the CPU);
``zoo_entry(name)`` says what it is: source, licence, paper, input (units, shape), output (probabilities or
logits) and the task that reads it. A config names one as ``model: {zoo: deepbet, kwargs: {size: 192}}``: the
weights come from an installed package, not from code the config names, so no ``--allow-code`` is needed.
Nothing downloads: a model whose package or weight files are missing is one line naming what to install or
where to put the file.

=================  ===========================================================================================
``deepbet``        deepbet's two-stage brain extraction (:class:`medadv.models.deepbet.Deepbet`)
``deepbet-bbox``   deepbet's coarse stage alone (:class:`medadv.models.deepbet.DeepbetBBox`), fast on a CPU
``robustbench``    a RobustBench zoo classifier from a local ``model_dir`` (:mod:`medadv.adapters.robustbench`)
=================  ===========================================================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..params import InvalidParameterError, closest

__all__ = ["ZooEntry", "available_models", "zoo_entry", "load_model", "zoo_task", "describe_models", "describe_model",
           "check_kwargs", "missing"]


@dataclass(frozen=True)
class ZooEntry:
    """What a zoo model is and how it loads.

    Attributes:
        name: the registry name.
        summary: one line.
        source: where the weights come from (package and file).
        licence: the weights' licence.
        paper: the reference to cite.
        input: what ``forward`` takes: units, shape, orientation.
        output: what ``forward`` returns.
        outputs: ``"probabilities"`` or ``"logits"`` (the :class:`~medadv.tasks.Task` ``outputs`` option).
        task: the registered task kind that reads the output, and its parameters.
        requires: the command that installs what the model needs.
        loader: builds the module; its keyword arguments are ``load_model``'s.
        check: ``None`` when what the model needs is on this machine, else one line saying what to install.
        task_params: the task kind's parameters (``outputs`` among them).
    """

    name: str
    summary: str
    source: str
    licence: str
    paper: str
    input: str
    output: str
    outputs: str
    task: str
    requires: str
    loader: Callable[..., nn.Module]
    check: Callable[[], str | None]
    task_params: dict[str, Any] = field(default_factory=dict)

    def parameters(self) -> list[str]:
        """The keyword arguments ``load_model(name, ...)`` takes for this model."""
        params = inspect.signature(self.loader).parameters.values()
        return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


# --- loaders: imports inside, so listing the zoo imports no model code and no toolkit ------------------------------
def _deepbet(bbox_size: int | list[int] = 128, size: int | list[int] = 256, margin: float = 0.1,
             distribution: str = "deepbet") -> nn.Module:
    from .deepbet import Deepbet

    return Deepbet(bbox_size=_sides(bbox_size), size=_sides(size), margin=margin, distribution=distribution).eval()


def _deepbet_bbox(size: int | list[int] = 128, distribution: str = "deepbet") -> nn.Module:
    from .deepbet import DeepbetBBox

    return DeepbetBBox(size=_sides(size), distribution=distribution).eval()


def _sides(value: Any) -> Any:
    # a config gives three sides as a YAML list; the wrappers take an int or a tuple
    return tuple(value) if isinstance(value, list) else value


def _deepbet_missing() -> str | None:
    from .deepbet import deepbet_weights

    try:
        deepbet_weights()
    except FileNotFoundError as e:
        return str(e)
    return None


def _robustbench_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("robustbench") is None:
        return "robustbench is not installed; install it with: pip install robustbench pyautoattack"
    return None


def _robustbench(name: str, model_dir: str, dataset: str = "cifar10", threat_model: str = "Linf") -> nn.Module:
    # the adapter imports robustbench (a toolkit): only when this entry is loaded, never when the zoo is listed
    from medadv.adapters.robustbench import load_zoo_model

    return load_zoo_model(name, model_dir, dataset=dataset, threat_model=threat_model).model


def _deepbet_entry(name: str, summary: str, output: str, loader: Callable[..., nn.Module]) -> ZooEntry:
    return ZooEntry(
        name=name, summary=summary, output=output, loader=loader, check=_deepbet_missing,
        source="PyPI deepbet==1.0.2, TorchScript files in its wheel (<site-packages>/data/models/), read without "
               "importing deepbet",
        licence="MIT",
        paper="Fisch et al., deepbet: Fast brain extraction of T1-weighted MRI using Convolutional Neural Networks, "
              "Computers in Biology and Medicine 179 (2024) 108845",
        input="T1 head with skull, grey levels as stored (scanner units, e.g. Colin27 uint8 0..254) as float, "
              "(N, 1, D, H, W), RAS canonical orientation; any grid (resampled inside)",
        outputs="probabilities", task="segmentation", requires="pip install deepbet==1.0.2",
        task_params={"num_classes": 2, "outputs": "probabilities"})


_ZOO: dict[str, ZooEntry] = {
    e.name: e for e in (
        _deepbet_entry("deepbet", "brain extraction, two stages (bbox 128³ -> box crop -> fine 256³), preprocessing "
                       "inside", "softmax probabilities (N, 2, D, H, W) on the input grid; channel 1 = brain",
                       _deepbet),
        _deepbet_entry("deepbet-bbox", "brain extraction, deepbet's coarse stage alone at `size` (128³ published; "
                       "96³/64³ on a CPU)", "softmax probabilities (N, 2, D, H, W) on the input grid (nearest-exact "
                       "from `size`); channel 1 = brain", _deepbet_bbox),
        ZooEntry(name="robustbench", summary="a RobustBench zoo classifier (`name`) from a local `model_dir`",
                 source="RobustBench checkpoints put by the user at model_dir/<dataset>/<threat_model>/<name>.pt",
                 licence="per model (RobustBench model zoo)", paper="Croce et al., RobustBench, NeurIPS 2021 "
                 "Datasets and Benchmarks", input="RGB images in [0, 1], (N, 3, H, W)",
                 output="logits (N, classes)", outputs="logits", task="multiclass",
                 requires="pip install robustbench pyautoattack", loader=_robustbench,
                 check=_robustbench_missing),
    )
}


def available_models() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(_ZOO)


def zoo_entry(name: str) -> ZooEntry:
    """The zoo entry called ``name`` (case-insensitive); an unknown name gets the closest one."""
    key = str(name).lower()
    if key not in _ZOO:
        c = closest(key, _ZOO)
        hint = f"; did you mean {c!r}?" if c else ""
        raise InvalidParameterError(f"unknown zoo model {name!r}{hint} (available: {', '.join(available_models())})")
    return _ZOO[key]


def check_kwargs(name: str, kwargs: dict[str, Any]) -> ZooEntry:
    """The entry for ``name``, after refusing keyword arguments its loader does not take (closest one named)."""
    entry = zoo_entry(name)
    accepted = entry.parameters()
    for k in kwargs:
        if k not in accepted:
            c = closest(str(k), accepted)
            hint = f"; did you mean `{c}`?" if c else ""
            raise InvalidParameterError(f"unknown parameter `{k}` for zoo model {entry.name!r}{hint} "
                                        f"(parameters: {', '.join(accepted) or 'none'})")
    required = [p.name for p in inspect.signature(entry.loader).parameters.values()
                if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if required:
        raise InvalidParameterError(f"zoo model {entry.name!r} needs {', '.join(f'`{r}`' for r in required)}")
    return entry


def load_model(name: str, /, **kwargs: Any) -> nn.Module:
    """Build the zoo model ``name`` with its published weights, offline, in eval mode on the CPU.

    ``kwargs`` are the model's (``zoo_entry(name).parameters()``), e.g. ``load_model("deepbet-bbox", size=96)``;
    ``name`` is positional-only, so a model may take a ``name`` of its own (``load_model("robustbench",
    name="Standard", model_dir=...)``).
    Raises ``InvalidParameterError`` (a ``ValueError``) for an unknown name or argument, and ``FileNotFoundError``
    naming the install command or the file when the weights are not on this machine.
    """
    entry = check_kwargs(name, kwargs)
    return entry.loader(**kwargs).eval()


def zoo_task(name: str) -> Any:
    """The :class:`~medadv.tasks.Task` that reads zoo model ``name``'s output (e.g. 2-class segmentation of
    probabilities for deepbet)."""
    from ..tasks import get_task

    entry = zoo_entry(name)
    return get_task(entry.task, **entry.task_params)


def missing(name: str) -> str | None:
    """Why zoo model ``name`` cannot load on this machine (one line naming what to install), or ``None`` when its
    package and weight files are here (RobustBench checkpoints are the user's files: only the package is checked)."""
    return zoo_entry(name).check()


def describe_model(name: str) -> str:
    """Every field of zoo model ``name``'s entry, one per line, and whether it can load here."""
    e = zoo_entry(name)
    why = missing(e.name)
    rows = [("summary", e.summary), ("source", e.source), ("licence", e.licence), ("paper", e.paper),
            ("input", e.input), ("output", e.output), ("task", f"{e.task} {e.task_params or ''}".strip()),
            ("parameters", ", ".join(e.parameters())), ("requires", e.requires),
            ("status", "ready (offline)" if why is None else f"missing: {why}")]
    return "\n".join([e.name] + [f"  {k + ':':<12}{v}" for k, v in rows])


def describe_models() -> list[dict[str, str]]:
    """One row per zoo model (name, summary, source, licence, paper, input, output, requires, parameters): what
    ``medadv models`` prints."""
    return [{"name": e.name, "summary": e.summary, "source": e.source, "licence": e.licence, "paper": e.paper,
             "input": e.input, "output": e.output, "task": e.task, "requires": e.requires,
             "parameters": ", ".join(e.parameters())} for e in (_ZOO[n] for n in available_models())]
