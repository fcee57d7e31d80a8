"""Case figures: what an attack did to a few single images or volumes.

A :class:`Case` holds one sample before and after an attack (input, perturbation, predictions). Its figure
(:func:`plot_case`) shows, left to right, the **clean image**, the **attacked image** (both through the same
grey window: a CT preset or the data's percentiles, :mod:`medadv.report.windows`), the **amplified
perturbation** (``x' − x`` with the colour range stretched to its largest magnitude, so a perturbation of
1/255 is visible; the title says by how much relative to the image's grey range, the colour bar gives its
scale in the data's units), the **clean prediction** and the **attacked prediction**. Voxels are drawn with
their physical proportions when the case knows its spacing (:func:`~medadv.report.windows.plane_aspect`):

- classification (multi-class or multi-label): the predicted probabilities as bars, true classes marked;
- 2-D segmentation: the label maps over the image (and the ground truth when known);
- 3-D segmentation or any 3-D input: three rows, the three orthogonal slices through the *most-changed
  voxel* (:func:`most_changed_voxel`), with a crosshair on it.

Build cases with :func:`select_cases` (runs one attack and picks the samples it changed most),
:func:`worst_cases` (after :func:`~medadv.evaluation.evaluate`: the samples each attack damaged most
according to the results table, re-attacked exactly as evaluate attacked them) or :func:`make_cases`
(from tensors you already have), then pass them to :func:`medadv.report.html.write_html_report`
(``cases=``) or call :func:`plot_case` yourself.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..runtime import target_for
from ..tasks import Task, available_tasks, task_class
from .windows import DisplayWindow, WindowSpec, check_window, display_window, plane_aspect

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..attacks.base import Attack

__all__ = ["Case", "SaliencyPair", "make_cases", "select_cases", "worst_cases", "damage", "volume_axis_names",
           "most_changed_voxel", "plot_case", "case_meta"]

#: the ways a case draws a prediction (:attr:`Case.kind`, a task's ``case_view``)
CASE_VIEWS = ("classes", "labels", "map", "values", "image")


def _view_alias(kind: Any) -> Any:
    """The view a registered task kind's name stands for: the kind's declared ``traits.report.case_view``
    (``"multiclass"`` → ``"classes"``; ``"image"`` where it declares none); anything else unchanged."""
    if isinstance(kind, str) and kind not in CASE_VIEWS and kind.lower() in available_tasks():
        return task_class(kind).traits.report.case_view or "image"
    return kind


#: colours of segmentation classes 1, 2, ... (background is left transparent); colour-blind-safe (Okabe-Ito)
SEG_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")


@dataclass
class Case:
    """One sample before and after an attack.

    Attributes:
        x, x_adv: clean and attacked input ``(C, *spatial)`` (2-D or 3-D spatial).
        clean, adv: hard predictions: a class index ``()``, a 0/1 label vector ``(L,)`` or a label map
            ``(*spatial)``.
        kind: how the prediction is drawn (the task's :attr:`~medadv.tasks.Task.case_view`): ``"classes"`` (a class
            index, score bars), ``"labels"`` (a 0/1 vector, score bars), ``"map"`` (a label map over the image),
            ``"values"`` (numbers: clean, attacked and true value per output) or ``"image"`` (image and perturbation
            only). The task kind names ``"multiclass"``, ``"multilabel"``, ``"segmentation"`` are accepted.
        label: ground truth shaped like ``clean`` (optional).
        clean_scores, adv_scores: class probabilities ``(K,)`` (classification; optional).
        class_names: names of the classes or labels (default ``0, 1, ...``).
        title: shown above the figure (e.g. ``"sample 3 · PGD ε=0.063"``).
        note: one line under the title (e.g. the metrics before and after).
        axis_names: names of the three axes of a volume (e.g. ``("sagittal", "coronal", "axial")`` for
            RAS-ordered arrays); the slice *through* axis ``i`` is labelled ``axis_names[i]``.
        spacing: the voxel size along each spatial axis (mm, or any unit shared by the axes); the figure draws
            voxels with these proportions. ``None``: square voxels.
        window: the grey window of the images (:func:`~medadv.report.windows.display_window`): a CT preset
            (``"brain"``, ``"soft_tissue"``, ``"lung"``, ``"bone"``), ``[width, level]`` in data units,
            ``"percentile"``, or ``None``/``"auto"`` (HU-looking data: soft tissue, else 1–99 % percentiles).
    """

    x: Tensor
    x_adv: Tensor
    clean: Tensor
    adv: Tensor
    kind: str
    label: Tensor | None = None
    clean_scores: Tensor | None = None
    adv_scores: Tensor | None = None
    class_names: Sequence[str] | None = None
    title: str = ""
    note: str = ""
    axis_names: Sequence[str] = ("axis 0", "axis 1", "axis 2")
    spacing: Sequence[float] | None = None
    window: WindowSpec = None

    def __post_init__(self) -> None:
        self.kind = _view_alias(self.kind)
        if self.kind not in CASE_VIEWS:
            raise ValueError(f"`kind` must be one of {', '.join(map(repr, CASE_VIEWS))}, got {self.kind!r}")
        if self.x.shape != self.x_adv.shape:
            raise ValueError(f"`x` {tuple(self.x.shape)} and `x_adv` {tuple(self.x_adv.shape)} differ in shape")
        if self.x.ndim not in (3, 4):
            raise ValueError(f"`x` must be one sample (C, H, W) or (C, D, H, W), got shape {tuple(self.x.shape)}")
        self.window = check_window(self.window)
        if self.spacing is not None:
            # the one parser of a spacing argument (HD95 and the volume columns read it the same way)
            from ..metrics.surface import _spacing_table

            self.spacing = tuple(_spacing_table(self.spacing, 1, self.x.ndim - 1)[0].tolist())
        if self.kind == "map" and tuple(self.clean.shape) != tuple(self.x.shape[1:]):
            raise ValueError(f"a segmentation case needs label maps shaped like the image {tuple(self.x.shape[1:])}, "
                             f"got {tuple(self.clean.shape)}")
        for name in ("x", "x_adv", "clean", "adv", "label", "clean_scores", "adv_scores"):
            v = getattr(self, name)
            if v is not None:
                setattr(self, name, v.detach().cpu())

    @property
    def delta(self) -> Tensor:
        return (self.x_adv.double() - self.x.double()).float()

    @property
    def volumetric(self) -> bool:
        return self.x.ndim == 4

    def names(self, k: int) -> list[str]:
        return list(self.class_names) if self.class_names is not None and len(self.class_names) >= k \
            else [str(i) for i in range(k)]


@dataclass
class SaliencyPair:
    """Explanation maps before and after an explanation attack, drawn with
    :func:`medadv.report.saliency_figures.plot_saliency_attack` (one row per sample).

    ``map_clean`` / ``map_adv`` are ``(N, *spatial)``, e.g. ``result.extras["map"]`` and ``["map_adv"]`` of a
    saliency attack; ``from_result`` takes them from an :class:`~medadv.attacks.base.AttackResult`.
    """

    x: Tensor
    x_adv: Tensor
    map_clean: Tensor
    map_adv: Tensor
    target_map: Tensor | None = None
    title: str = ""
    row_titles: Sequence[str] | None = None
    rows: Sequence[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_result(cls, x: Tensor, result: Any, title: str = "", **kw: Any) -> SaliencyPair:
        ex = result.extras
        if "map" not in ex or "map_adv" not in ex:
            raise ValueError("the attack result has no explanation maps (`map`, `map_adv`): is it a saliency attack?")
        return cls(x, result.x_adv, ex["map"], ex["map_adv"], target_map=ex.get("target_map"), title=title, **kw)

    def figure(self) -> Figure:
        from .saliency_figures import plot_saliency_attack

        return plot_saliency_attack(self.x, self.x_adv, self.map_clean, self.map_adv, rows=self.rows,
                                    target_map=self.target_map, row_titles=self.row_titles, title=self.title or None)


# --- building cases ----------------------------------------------------------------------------------------------
def _view(task: Task) -> str:
    """How cases of ``task`` draw a prediction: its declared ``case_view``, else image and perturbation only."""
    if not isinstance(task, Task):
        raise TypeError(f"cases need a medadv Task (a kind of medadv.tasks.available_tasks()), got {task!r}")
    return task.case_view or "image"


def make_cases(
    task: Task,
    x: Tensor,
    x_adv: Tensor,
    clean_logits: Tensor,
    adv_logits: Tensor,
    y: Tensor | None = None,
    *,
    indices: Sequence[int] | None = None,
    k: int = 3,
    class_names: Sequence[str] | None = None,
    title: str = "",
    axis_names: Sequence[str] | None = None,
    spacing: Any = None,
    window: WindowSpec = None,
) -> list[Case]:
    """Cases from tensors already computed (a batch ``x`` and its attacked version ``x_adv``).

    Args:
        task: how to read the logits.
        x, x_adv: ``(N, C, *spatial)``.
        clean_logits, adv_logits: the model's outputs on ``x`` and ``x_adv``.
        y: labels (optional; shown as ground truth and used for the metric line).
        indices: which samples; default the ``k`` the attack changed most (fraction of changed
            labels/voxels, then the perturbation norm).
        k: how many cases when ``indices`` is not given.
        class_names: names of the classes/labels.
        title: prefix of each case's title (e.g. the attack and budget).
        axis_names: names of a volume's three axes (see :class:`Case`).
        spacing: voxel size per spatial axis (mm): one number, one per axis, or one row per sample of ``x``;
            the figures draw voxels with these proportions (``None``: square).
        window: the images' grey window (see :class:`Case`).
    """
    if x.shape != x_adv.shape:
        raise ValueError(f"`x` {tuple(x.shape)} and `x_adv` {tuple(x_adv.shape)} differ in shape")
    kind = _view(task)
    window = check_window(window)  # refused before any work
    spacings = None
    if spacing is not None:
        from ..metrics.surface import _spacing_table

        spacings = _spacing_table(spacing, x.shape[0], x.ndim - 2).tolist()
    x, x_adv = x.detach().cpu(), x_adv.detach().cpu()
    clean_logits, adv_logits = clean_logits.detach().cpu().float(), adv_logits.detach().cpu().float()
    y = None if y is None else y.detach().cpu()
    cp, ap = task.predict(clean_logits), task.predict(adv_logits)
    if indices is None:
        # the share of changed labels / voxels (a class flip counts 1), then the perturbation's L2 norm as a
        # tie-break (scaled far below one changed element)
        norm = (x_adv - x).flatten(1).double().norm(dim=1)
        change = task.change_fraction(cp, ap).double() + 1e-9 * norm / (1.0 + norm.max())
        order = torch.argsort(change, descending=True, stable=True)
        indices = order[: max(0, min(k, x.shape[0]))].tolist()
    scores = (task.case_scores(clean_logits), task.case_scores(adv_logits))
    cases = []
    for i in indices:
        i = int(i)
        head = f"sample {i}" if not title else f"{title} · sample {i}"
        cases.append(Case(
            x[i], x_adv[i], cp[i], ap[i], kind, label=None if y is None else y[i],
            clean_scores=None if scores[0] is None else scores[0][i],
            adv_scores=None if scores[1] is None else scores[1][i],
            class_names=class_names, title=head, note="" if y is None else task.case_note(y[i], cp[i], ap[i]),
            axis_names=tuple(axis_names) if axis_names is not None else ("axis 0", "axis 1", "axis 2"),
            spacing=None if spacings is None else spacings[i], window=window,
        ))
    return cases


def select_cases(
    model: nn.Module,
    task: Task,
    x: Tensor,
    y: Tensor,
    attack: Attack,
    *,
    k: int = 3,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
    axis_names: Sequence[str] | None = None,
    spacing: Any = None,
    window: WindowSpec = None,
) -> list[Case]:
    """Attack the batch ``(x, y)`` once and return the ``k`` samples the attack changed most.

    The title of each case names the attack and its budget (``attack.name``, ``attack.budget``). A model that
    returns probabilities is read through :meth:`~medadv.tasks.Task.logits_model` when ``task`` declares
    ``outputs="probabilities"`` (and refused by the attack, before it steps, when it does not). ``spacing``
    and ``window`` as in :func:`make_cases`.
    """
    from ..attack_cache import craft
    from ..runtime import attack_mode, forward_tensor, model_device

    window = check_window(window)  # refused before the attack runs

    model = task.logits_model(model)  # declared probabilities: the logits the attack and the case read
    device = model_device(model)
    xd, yd = x.to(device), y.to(device)
    with attack_mode(model), torch.no_grad():
        clean_logits = forward_tensor(model, xd)
    res = craft(attack, model, xd, yd)  # read back from the run's cache when this sample was attacked already
    if title is None:
        title = attack.name if attack.budget is None else f"{attack.name} ε={attack.budget:.4g}"
    return make_cases(task, x, res.x_adv, clean_logits, res.logits, y, k=k, class_names=class_names, title=title,
                      axis_names=axis_names, spacing=spacing, window=window)


def _metric_column(task: Task) -> str:
    """The results column of the task's robust metric (``clean_<it>``/``adv_<it>``)."""
    return task.robust_metric_column or str(task.robust_metric_name)


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else float("nan")


def _drop(row: Mapping[str, Any], col: str) -> float:
    d = _num(row.get(f"clean_{col}")) - _num(row.get(f"adv_{col}"))
    return d if d == d else float("-inf")


def damage(task: Task, row: Mapping[str, Any]) -> tuple[float, ...]:
    """How much the attack damaged one sample (larger is worse), from its row of the results table.

    First the drop of the task's robust metric (clean − attacked: accuracy, exact match, mean Dice), then,
    to order samples with the same drop, the drop of the finer metric (label accuracy, pixel accuracy),
    the share of changed voxels or labels (``changed_fraction``, ``flip_rate``) and whether the
    prediction changed at all.
    """
    finer = task.tiebreak_column
    return (_drop(row, _metric_column(task)), _drop(row, finer) if finer else 0.0,
            _num(row.get("changed_fraction", row.get("flip_rate", 0.0))), float(bool(row.get("changed"))))


def volume_axis_names(affine: Tensor | None) -> tuple[str, str, str] | None:
    """Names of a volume's three array axes from its voxel-to-world affine (RAS world): the slice through an
    axis along left-right is sagittal, along anterior-posterior coronal, along inferior-superior axial. None
    when there is no affine or two axes point the same way (an oblique volume)."""
    if affine is None or tuple(affine.shape[-2:]) != (4, 4):
        return None
    world = affine.double()[:3, :3].abs().argmax(dim=0).tolist()  # the world axis each array axis runs along
    if len(set(world)) != 3:
        return None
    planes = ("sagittal", "coronal", "axial")
    return planes[world[0]], planes[world[1]], planes[world[2]]


def _family_of(name: str, attack: Attack) -> str:
    return name.rsplit("@", 1)[0] if attack.budget is not None and "@" in name else name


def _budget_text(budget: float | None) -> str:
    if budget is None:
        return ""
    k = float(budget) * 255
    frac = f" ({round(k)}/255)" if 0 < k < 255 and abs(k - round(k)) < 1e-6 else ""
    return f" ε={float(budget):.4g}{frac}"


def worst_cases(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: Mapping[str, Attack],
    results: Any,
    *,
    k: int = 2,
    seed: int | None = None,
    target_fn: Callable[[Tensor, Tensor, Tensor], Tensor] | Mapping[str, Callable[..., Tensor]] | None = None,
    class_names: Sequence[str] | None = None,
    axis_names: Sequence[str] | None = None,
    strongest_only: bool = False,
    max_attacks: int = 6,
    image_key: str = "image",
    label_key: str = "label",
    hd95_unit: str | None = None,
    spacing: Any = None,
    window: WindowSpec = None,
) -> list[Case]:
    """The ``k`` samples each attack damaged most in ``results``, re-attacked exactly as
    :func:`~medadv.evaluation.evaluate` attacked them, as cases to draw.

    Each attack family (``pgd@0.016`` and ``pgd@0.063`` are both ``pgd``) is drawn at its largest budget,
    families in the order of ``attacks``, at most ``max_attacks`` of them (those with the lowest attacked
    robust metric when there are more); ``strongest_only``: only the (attack, budget) with the lowest mean
    attacked robust metric. Samples are ranked by :func:`damage` (the drop of the task's robust metric).

    The samples are found again by iterating ``data`` as evaluate did (same batches, same sample numbers;
    iteration stops after the last batch needed) and their whole batch is attacked again under the per-batch
    seed of ``evaluate(seed=...)``, so with the same ``seed`` (and ``target_fn``) the adversarial example is
    the one the table measured (on CPU: identical; where the attack's robust metric differs from the row's,
    the case's note says so).

    Args:
        model, task, data, attacks: what was given to evaluate (``attacks`` by the names in ``results``).
        results: its :class:`~medadv.results.Results`.
        k: cases per attack.
        seed, target_fn: as given to evaluate.
        class_names: names of the classes / labels.
        axis_names: names of a volume's three axes; default from each case's affine
            (:func:`volume_axis_names`), else ``axis 0, 1, 2``.
        strongest_only, max_attacks: which attacks are drawn (above).
        image_key, label_key: the keys of a dictionary batch, as given to evaluate.
        hd95_unit: the unit of the HD95 in the case notes (rows of ``evaluate(hd95=True)``); default ``mm``
            for batches with an affine (evaluate read the voxel spacing from it), else none.
        spacing: the voxel spacing (mm) the figures draw with, as given to evaluate; ``None``: each case's
            spacing from its affine, else square voxels.
        window: the images' grey window (see :class:`Case`; the config's ``report: {window: ...}``).
    """
    from ..attack_cache import craft
    from ..evaluation import _seeded
    from ..evaluation_batches import Source, parse_batch
    from ..fingerprints import is_targeted, sample_hashes
    from ..runtime import attack_mode, forward_tensor, model_device

    window = check_window(window)
    if k <= 0 or not len(getattr(results, "rows", ())):
        return []
    # declared probabilities: the clean logits handed to the attack are the ones evaluate() read
    model = task.logits_model(model)
    col = _metric_column(task)
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for r in results.rows:
        if r.get("attack") in attacks:
            by_name.setdefault(str(r["attack"]), []).append(r)
    if not by_name:
        return []

    def mean_adv(name: str) -> float:
        vals = [_num(r.get(f"adv_{col}")) for r in by_name[name]]
        vals = [v for v in vals if v == v]
        return sum(vals) / len(vals) if vals else float("inf")

    if strongest_only:
        chosen = [min(by_name, key=mean_adv)]
    else:
        largest: dict[str, str] = {}
        for name in attacks:
            if name not in by_name:
                continue
            fam, budget = _family_of(name, attacks[name]), attacks[name].budget
            if fam not in largest or (budget is not None and float(budget) > float(attacks[largest[fam]].budget or 0)):
                largest[fam] = name
        chosen = list(largest.values())
        if len(chosen) > max_attacks:
            keep = set(sorted(chosen, key=mean_adv)[:max_attacks])
            chosen = [n for n in chosen if n in keep]
    wanted: dict[str, list[Mapping[str, Any]]] = {}
    for name in chosen:
        rows = sorted(by_name[name], key=lambda r: int(r["sample"]))
        rows = sorted(rows, key=lambda r: damage(task, r), reverse=True)  # stable: ties by sample number
        wanted[name] = rows[:k]
    need = {int(r["sample"]) for rows in wanted.values() for r in rows}
    device = model_device(model)
    found: dict[tuple[str, int], Case] = {}
    for b, offset, raw in Source(data, None, image_key, label_key):
        if not need:
            break
        batch = parse_batch(raw, task, image_key, label_key)
        if batch.x.ndim < 3:  # feature vectors (N, F): there is no image to draw
            return []
        ids = range(offset, offset + int(batch.x.shape[0]))
        here = need & set(ids)
        if not here:
            continue
        need -= here
        x_d, y_d = batch.x.to(device), batch.y.to(device)
        # the row's sample must be this data (a shuffling loader would put other samples at these numbers);
        # evaluate hashed the batch where it had it: on the host, or on an accelerator
        hashes = [set(h) for h in zip(sample_hashes(batch.x, batch.y, batch.extras()), *(
            [sample_hashes(x_d, y_d, batch.extras())] if x_d.device.type != "cpu" else []), strict=True)]
        with attack_mode(model), torch.no_grad():
            clean_logits = forward_tensor(model, x_d)
        for name in chosen:
            local = []
            for r in wanted[name]:
                if int(r["sample"]) not in here:
                    continue
                if r.get("data") is not None and r["data"] not in hashes[int(r["sample"]) - offset]:
                    warnings.warn(f"worst_cases: sample {r['sample']} of `data` is not the data of its row in the "
                                  "results (a shuffled or changed data source?): not drawn", RuntimeWarning,
                                  stacklevel=2)
                    continue
                local.append(int(r["sample"]) - offset)
            if not local:
                continue
            atk = attacks[name]
            with _seeded(seed, f"{b}:{name}:{atk.budget}", device):  # the key evaluate() seeds this batch with
                fn = target_for(target_fn, name)
                target = fn(x_d, y_d, clean_logits) if fn is not None and is_targeted(atk) else y_d
                # through the run's cache: inside a Run these are the examples evaluate() crafted, read back
                res = craft(atk, model, x_d, target, clean_logits=clean_logits)
            for i in local:
                sample = offset + i
                row = next(r for r in wanted[name] if int(r["sample"]) == sample)
                aff = batch.affine[i] if batch.affine is not None else None
                axes = axis_names if axis_names is not None else volume_axis_names(aff)
                # the voxel spacing as evaluate reads it: the argument, else the case's header
                (case,) = make_cases(task, batch.x, res.x_adv, clean_logits, res.logits, batch.y, indices=[i],
                                     class_names=class_names, axis_names=axes, window=window,
                                     spacing=spacing if spacing is not None else batch.spacing())
                cid = str(row.get("case_id", sample))
                who = f"case {cid}" + (f" (sample {sample})" if cid != str(sample) else "")
                case.title = f"{_family_of(name, atk)}{_budget_text(atk.budget)} · {who}"
                unit = hd95_unit if hd95_unit is not None else "mm" if batch.affine is not None else ""
                case.note = _row_note(task, row, res.logits[i : i + 1], y_d[i : i + 1], case.note, unit)
                found[(name, sample)] = case
    return [found[(name, int(r["sample"]))] for name in chosen for r in wanted[name]
            if (name, int(r["sample"])) in found]


def _row_note(task: Task, row: Mapping[str, Any], adv_logits: Tensor, y: Tensor, note: str, unit: str = "") -> str:
    """The case's metric line, plus HD95 from its row (when computed) and a warning when the re-attack's
    robust metric is not the one in the table (a non-deterministic attack or another seed)."""
    col = _metric_column(task)
    extra = []
    ch, ah = row.get("clean_hd95"), row.get("adv_hd95")
    if isinstance(ch, list) and isinstance(ah, list):
        c = [float(v) for v in ch if isinstance(v, int | float) and v == v and v != float("inf")]
        a = [float(v) for v in ah if isinstance(v, int | float) and v == v and v != float("inf")]
        if c and a:
            extra.append(f"mean HD95 {sum(c) / len(c):.1f} → {sum(a) / len(a):.1f}" + (f" {unit}" if unit else ""))
    table = _num(row.get(f"adv_{col}"))
    again = float(task.robust_metric(adv_logits.float(), y)[0])
    if table == table and abs(table - again) > 1e-4:
        extra.append(f"re-attacked: {col.replace('_', ' ')} {again:.3f}, table {table:.3f}")
    return " · ".join([note, *extra]) if note else " · ".join(extra)


# --- the most-changed voxel --------------------------------------------------------------------------------------
def most_changed_voxel(case: Case) -> tuple[int, ...]:
    """The spatial index the 3-D figure slices through.

    For segmentation, the centre of the densest patch of changed predictions: the changed-voxel map is
    smoothed with a Gaussian (σ = 1.5 voxels, zeros outside the volume), so a changed region beats an isolated
    flipped voxel and its centre beats its rim. The voxel is sought at least 1/8 of the size away from the
    crop border when the smoothed change reaches there (the padded border is where a model's output is
    least reliable, and a border slice shows little). When no prediction changed (or for classification),
    the same on the perturbation's magnitude summed over channels. Ties go to the first index in C order.
    """
    spatial = tuple(case.x.shape[1:])
    change = torch.zeros(spatial, dtype=torch.float64)
    if case.kind == "map":
        change = (case.clean != case.adv).double()
    if not bool(change.any()):
        change = case.delta.double().abs().sum(0)
    r = 3
    g = torch.exp(-torch.arange(-r, r + 1, dtype=torch.float64) ** 2 / (2 * 1.5**2))
    density = change[None, None]
    for axis in range(len(spatial)):  # separable blur, zero padding
        shape = [1, 1] + [1] * len(spatial)
        shape[2 + axis] = 2 * r + 1
        pad = [0] * len(spatial)
        pad[axis] = r
        conv = F.conv3d if len(spatial) == 3 else F.conv2d
        density = conv(density, g.reshape(shape), padding=tuple(pad))
    density = density[0, 0]
    # keep away from the crop border when the change reaches inside: a model's output is least reliable at
    # the padded border, and a slice along the border face shows little of the volume
    inner = tuple(slice(n // 8, n - n // 8) for n in spatial)
    if bool(density[inner].gt(0).any()):
        masked = torch.full_like(density, -1.0)
        masked[inner] = density[inner]
        density = masked
    flat = int(torch.argmax(density.reshape(-1)))
    return tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), spatial))


# --- figures -----------------------------------------------------------------------------------------------------
def _window(case: Case) -> DisplayWindow:
    """The grey range of the case's images, the clean and the attacked alike: channel 0 through the case's
    window (:func:`~medadv.report.windows.display_window`); RGB (3 channels) from the clean image's min to max."""
    if case.x.shape[0] == 3:
        lo, hi = float(case.x.min()), float(case.x.max())
        return DisplayWindow(lo, hi if hi > lo else lo + 1e-6, "RGB, min–max", "data units")
    return display_window(case.x[0], case.window)


def _display(img: Tensor, win: DisplayWindow) -> tuple[Tensor, dict[str, Any]]:
    """An image to show through ``win``: RGB for 3 channels, else channel 0 in grey."""
    img = img.float()
    if img.shape[0] == 3:
        return ((img - win.lo) / max(win.width, 1e-12)).clamp(0, 1).permute(1, 2, 0), {}
    return img[0], dict(cmap="gray", vmin=win.lo, vmax=win.hi)


def _delta_plane(delta: Tensor) -> Tensor:
    """The perturbation shown: the channel mean for RGB, else channel 0 (the channel the image shows)."""
    return delta.mean(0) if delta.shape[0] == 3 else delta[0]


def _seg_overlay(ax: Axes, img: Tensor, img_kw: dict[str, Any], labels: Tensor, ncls: int, **imshow: Any) -> None:
    import numpy as np
    from matplotlib.colors import ListedColormap

    ax.imshow(img.numpy(), **img_kw, **imshow)
    colours = ["#00000000"] + [SEG_COLOURS[(j - 1) % len(SEG_COLOURS)] for j in range(1, max(ncls, 2))]
    lab = labels.numpy().astype(np.float64)
    masked = np.ma.masked_where(lab == 0, lab)
    ax.imshow(masked, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(colours) - 0.5, alpha=0.55,
              interpolation="nearest", **imshow)


def _prob_bars(ax: Axes, case: Case, scores: Tensor | None, pred: Tensor, title: str) -> None:
    k = int(scores.numel()) if scores is not None else (int(pred.numel()) if case.kind == "labels"
                                                       else int(case.label.max()) + 1 if case.label is not None
                                                       else int(pred) + 1)
    names = case.names(k)
    if scores is None:  # hard predictions only
        scores = pred.double() if case.kind == "labels" else F.one_hot(pred.long(), k).double()
    vals = scores.double().tolist()
    truth: set[int] = set()
    if case.label is not None:
        truth = {int(case.label)} if case.kind == "classes" else \
            {j for j, v in enumerate(case.label.tolist()) if v >= 0.5}
    shown = list(range(k))
    if k > 12:  # many classes: the largest scores and the true classes
        top = sorted(range(k), key=lambda j: -vals[j])[:10]
        shown = sorted(set(top) | truth)
    ys = list(range(len(shown)))[::-1]
    colours = ["#0072B2" if j in truth else "#999999" for j in shown]
    ax.barh(ys, [vals[j] for j in shown], color=colours, height=0.7)
    ax.set_yticks(ys)
    ax.set_yticklabels([names[j] + (" ✓" if j in truth else "") for j in shown], fontsize=7)
    ax.set_xlim(0, 1)
    ax.tick_params(axis="x", labelsize=7)
    if case.kind == "labels":
        ax.axvline(0.5, color="#D55E00", lw=0.8, ls="--")
        pos = ", ".join(names[j] for j in range(k) if float(pred[j]) >= 0.5) or "none"
        ax.set_title(f"{title}\n" + _wrap(f"positive: {pos}", 42), fontsize=8)
    else:
        ax.set_title(f"{title}\n→ {names[int(pred)]}", fontsize=8)
    ax.set_xlabel("probability", fontsize=7)


def _value_bars(ax: Axes, case: Case) -> None:
    """Numeric predictions (regression): clean, attacked and (when known) true value of each output, grouped."""
    clean, adv = case.clean.double().reshape(-1), case.adv.double().reshape(-1)
    k = min(int(clean.numel()), 12)  # many outputs (a dense map): the first 12
    names = case.names(k)
    series = [("clean", clean, "#0072B2"), ("attacked", adv, "#D55E00")]
    if case.label is not None and case.label.numel() == clean.numel():
        series.append(("true", case.label.double().reshape(-1), "#999999"))
    h = 0.8 / len(series)
    for s_i, (name, v, colour) in enumerate(series):
        ys = [k - 1 - j + 0.4 - (s_i + 0.5) * h for j in range(k)]
        ax.barh(ys, v[:k].tolist(), height=h, color=colour, label=name)
    ax.set_yticks(list(range(k))[::-1])
    ax.set_yticklabels(names[:k], fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.axvline(0.0, color="#333333", lw=0.6)
    ax.legend(fontsize=7, frameon=False, loc="best")
    ax.set_title("prediction" + (f" (first {k} of {clean.numel()} outputs)" if clean.numel() > k else ""), fontsize=9)
    ax.set_xlabel("value (target units)", fontsize=7)


def _wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (at spaces), so a long list of labels stays
    above its own panel."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=False)) or text


def _off(ax: Axes) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def _colour_bar(fig: Figure, ax: Axes, image: Any, unit: str) -> None:
    """The perturbation's scale beside its panel, in the data's units (HU for CT)."""
    # an inset in the panel's axes coordinates: the bar is as tall as the image it explains, also when voxels
    # drawn to scale make the image short
    bar = fig.colorbar(image, cax=ax.inset_axes((1.04, 0.0, 0.06, 1.0)))
    bar.ax.tick_params(labelsize=6)
    bar.set_label(unit, fontsize=7)


def plot_case(case: Case, path: str | Path | None = None, *, dpi: int = 110) -> Figure:
    """The figure of one case (see the module docstring for its panels). Returns the matplotlib Figure;
    saves a PNG to ``path`` when given."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    delta = case.delta
    lim = float(delta.abs().max()) or 1e-12
    win = _window(case)
    seg = case.kind == "map"
    ncls = 0
    if seg:
        ncls = int(max(int(case.clean.max()), int(case.adv.max()),
                       int(case.label.max()) if case.label is not None else 0)) + 1
        ncls = max(ncls, len(case.class_names or ()))
    gt = seg and case.label is not None
    bars = case.kind in ("classes", "labels")
    # clean image, attacked image, perturbation; then the predictions: clean and attacked (and the truth) as
    # maps or score bars, one panel of values, or none
    ncol = 3 + (2 + int(gt) if seg or bars else 1 if case.kind == "values" else 0)
    delta_kw = dict(cmap="RdBu_r", vmin=-lim, vmax=lim)
    # how much more contrast the perturbation gets than the image: its colour range (2·lim) against the grey
    # window's width; the colour bar gives the absolute scale
    pert_title = f"perturbation, amplified ×{win.width / (2 * lim):.3g}\n(colour range ±{lim:.3g} {win.unit})"
    image_titles = (_wrap(f"clean image · {win.label}", 34), "attacked image\n(same window)")
    # say the voxels are drawn to scale (and how large they are)
    voxel = "" if case.spacing is None else "voxel " + " × ".join(f"{v:.3g}" for v in case.spacing) + " mm"

    if case.volumetric:
        centre = most_changed_voxel(case)
        fig, axes = plt.subplots(3, ncol, figsize=(2.35 * ncol + 0.5, 2.35 * 3 + 0.9), squeeze=False)
        for r in range(3):
            idx: list[Any] = [slice(None)] * 3
            idx[r] = centre[r]
            rest = [a for a in range(3) if a != r]
            # (first remaining axis, second) shown with the second axis vertical, origin at the bottom:
            # RAS-ordered volumes then appear upright; a row of pixels spans the second axis' spacing
            plane = lambda t, idx=tuple(idx): t[idx].T  # noqa: E731
            geom = {"origin": "lower", "aspect": plane_aspect(case.spacing, rest[1], rest[0])}
            cross = (centre[rest[0]], centre[rest[1]])
            img, img_kw = _display(case.x[(slice(None), *idx)], win)
            adv_img, _ = _display(case.x_adv[(slice(None), *idx)], win)
            img, adv_img = (t.T if t.ndim == 2 else t.permute(1, 0, 2) for t in (img, adv_img))
            row = axes[r]
            row[0].imshow(img.numpy(), **img_kw, **geom)
            row[1].imshow(adv_img.numpy(), **img_kw, **geom)
            _colour_bar(fig, row[2], row[2].imshow(plane(_delta_plane(delta)).numpy(), **delta_kw, **geom), win.unit)
            drawn = [0, 1, 2]
            if seg:
                layers = [(img, case.clean), (adv_img, case.adv)] + ([(img, case.label)] if gt else [])
                for c, (under, lab) in enumerate(layers, start=3):
                    assert lab is not None
                    _seg_overlay(row[c], under, img_kw, plane(lab), ncls, **geom)
                    drawn.append(c)
            elif r > 0:  # score bars and values are drawn once, in the first row
                for ax in row[3:]:
                    ax.axis("off")
            for c in drawn:
                ax = row[c]
                ax.axvline(cross[0], color="#F0E442", lw=0.6, alpha=0.8)
                ax.axhline(cross[1], color="#F0E442", lw=0.6, alpha=0.8)
                _off(ax)
            if r == 0:
                for c, name in enumerate([*image_titles, pert_title]):
                    row[c].set_title(name, fontsize=8)
                if seg:
                    for c, name in enumerate(["clean prediction", "attacked prediction", "ground truth"][:ncol - 3],
                                             start=3):
                        row[c].set_title(name, fontsize=9)
            row[0].set_ylabel(f"{case.axis_names[r]} = {centre[r]}", fontsize=8)
        axes[2][0].set_xlabel(voxel, fontsize=7)
        if case.kind == "values":
            _value_bars(axes[0][3], case)
        elif bars:
            _prob_bars(axes[0][3], case, case.clean_scores, case.clean, "clean prediction")
            _prob_bars(axes[0][4], case, case.adv_scores, case.adv, "attacked prediction")
    else:
        # classification: the score panels are wider (their label names stand beside the bars)
        widths = [1.0] * ncol if seg or not bars else [1.0, 1.0, 1.0, 1.6, 1.6]
        if case.kind == "values":
            widths = [1.0, 1.0, 1.0, 1.6]
        fig, axes = plt.subplots(1, ncol, figsize=(2.6 * sum(widths) + 0.5, 3.0 + 0.7 * (not seg)), squeeze=False,
                                 gridspec_kw={"width_ratios": widths})
        row = axes[0]
        geom = {"aspect": plane_aspect(case.spacing, 0, 1)}  # rows run along the first spatial axis
        img, img_kw = _display(case.x, win)
        adv_img, _ = _display(case.x_adv, win)
        row[0].imshow(img.numpy(), **img_kw, **geom)
        row[1].imshow(adv_img.numpy(), **img_kw, **geom)
        truth = ""
        if case.label is not None and bars:
            names = case.names(int(case.clean_scores.numel()) if case.clean_scores is not None
                               else int(case.label.numel()) if case.kind == "labels" else int(case.label) + 1)
            truth = names[int(case.label)] if case.kind == "classes" else \
                ", ".join(n for n, v in zip(names, case.label.tolist(), strict=False) if v >= 0.5) or "none"
        row[0].set_title(image_titles[0] + ("\n" + _wrap(f"true: {truth}", 30) if truth else ""), fontsize=8)
        row[1].set_title(image_titles[1], fontsize=8)
        _colour_bar(fig, row[2], row[2].imshow(_delta_plane(delta).numpy(), **delta_kw, **geom), win.unit)
        row[2].set_title(pert_title, fontsize=8)
        for ax in row[:3]:
            _off(ax)
        row[0].set_xlabel(voxel, fontsize=7)
        if seg:
            maps: list[tuple[str, Tensor, Tensor]] = [("clean prediction", img, case.clean),
                                                      ("attacked prediction", adv_img, case.adv)]
            if case.label is not None:
                maps.append(("ground truth", img, case.label))
            for c, (name, under, labels) in enumerate(maps, start=3):
                _seg_overlay(row[c], under, img_kw, labels, ncls, **geom)
                row[c].set_title(name, fontsize=9)
                _off(row[c])
        elif bars:
            _prob_bars(row[3], case, case.clean_scores, case.clean, "clean prediction")
            _prob_bars(row[4], case, case.adv_scores, case.adv, "attacked prediction")
        elif case.kind == "values":
            _value_bars(row[3], case)
    if seg and ncls > 1:  # (background only: nothing to name)
        names = case.names(ncls)
        handles = [Patch(color=SEG_COLOURS[(j - 1) % len(SEG_COLOURS)], label=names[j]) for j in range(1, ncls)]
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    head = case.title + (f"\n{case.note}" if case.note else "")
    if head:
        fig.suptitle(head, fontsize=10)  # tight_layout keeps the panels below it
    fig.tight_layout(rect=(0, 0.25 / fig.get_figheight() if seg else 0, 1, 1))
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        from ..safe_io import save_figure

        save_figure(fig, p, dpi=dpi)  # never through a link (issue 28)
    return fig


# --- cases inside a study's section ----------------------------------------------------------------------------------
def case_meta(cases: Sequence[Case]) -> list[dict[str, Any]]:
    """Cases as a study's ``meta["cases"]``: each drawn with :func:`plot_case` into a PNG, ``[{title, note, png,
    width, height}]`` with ``png`` the base64 text of the image and its size in pixels.

    The study's report section shows one figure per entry after its own blocks (alt text ``"case: <title>"``).
    Images, not tensors, are kept: the study's JSON stays small (about 60 kB per case instead of the volume)
    and strict JSON.
    """
    if isinstance(cases, Case) or not isinstance(cases, Sequence) or isinstance(cases, str):
        raise TypeError(f"`cases` must be a list of Case objects (make_cases, select_cases), got "
                        f"{type(cases).__name__}")
    bad = [i for i, c in enumerate(cases) if not isinstance(c, Case)]
    if bad:
        raise TypeError(f"`cases` must hold Case objects only; item {bad[0]} is {type(cases[bad[0]]).__name__}")
    from .blocks import figure_image

    out = []
    for c in cases:
        img = figure_image(plot_case(c), f"case: {c.title}")  # the report's PNG settings (dpi, white background)
        out.append({"title": c.title, "note": c.note, "png": img.src.split(",", 1)[1], "width": img.width,
                    "height": img.height})
    return out
