"""Saliency under attack, model × explanation method (Zhang et al. 2024, Tables 1 and 2).

Every attack runs once per model; every explanation method then explains the clean and the attacked input
(the class the clean prediction names, :meth:`~medadv.tasks.Task.explained_class`) and the study compares the two
maps. A prediction attack (PGD, FGSM) gives Zhang's Table 1 (how much the map moves when the prediction is
attacked); an attack on the explanation (``relevance``, ``resistance``) gives Table 2, with ``ssim_target`` (the
attacked map against the target map) for a targeted relevance attack. The maps compared are the methods' own,
normalised as :class:`~medadv.explain.Explanation` does (absolute value, channels summed, L1 = 1); SSIM is
computed on min–max scaled maps (:func:`~medadv.metrics.saliency.map_ssim`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, Strict, field_validator, model_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from ..explain import Explanation, available_explanations, get_explanation
from ..metrics.saliency import compare_maps, map_jsd, map_ssim, prediction_jsd, psc
from ..report.blocks import (
    Section,
    StudyLike,
    data_table,
    figure_image,
    heatmap,
    pyplot,
    setting_key,
)
from ..runtime import model_device
from ..tasks import Task
from ._common import (
    Attacked,
    AttackSpec,
    TargetFn,
    attacked_batches,
    check_models,
    check_task,
    forward,
    mean,
    named_attacks,
)
from .base import StudyResult
from .registry import StudySpec, pick_models, register_study, unknown_option

__all__ = ["saliency", "dataset_auc"]

#: the per-sample similarities kept in the rows (names of :func:`~medadv.metrics.saliency.compare_maps`)
SIMILARITIES = ("ssim", "spearman", "topk")


def _explanations(names: Sequence[str | Mapping[str, Any] | Explanation] | None) -> dict[str, Explanation]:
    if names is None:  # every registered method that needs no parameter (Grad-CAM needs its layer)
        out = {}
        for n in available_explanations():
            try:
                out[n] = get_explanation(n)
            except (TypeError, ValueError):
                continue
        return out
    out = {}
    for spec in names:
        e = get_explanation(spec)
        label = spec if isinstance(spec, str) else str(spec.get("name")) if isinstance(spec, Mapping) else e.name
        out[label] = e
    if not out:
        raise ValueError("`explanations` is empty: name at least one method (available: "
                         f"{', '.join(available_explanations())})")
    return out


def dataset_auc(task: Task, logits: Tensor, y: Tensor) -> float | None:
    """The dataset-level AUC of ``logits`` against ``y``, as ``Results.summary`` computes it: multi-label, the mean
    of the per-label AUCs of the sigmoid scores (:func:`~medadv.metrics.classification.macro_auc`); multi-class,
    the macro one-vs-rest AUC of the softmax scores (:func:`~medadv.metrics.classification.multiclass_auc`). A
    label or class whose AUC is undefined here is left out of the mean; ``None`` when none is defined or the task
    gives no class scores (segmentation)."""
    from ..metrics.classification import macro_auc, multiclass_auc

    y = y.to(logits.device)
    scores = task.outcome(logits, y).columns.get("scores")
    if not isinstance(scores, Tensor):
        return None
    scores, y = scores.detach().double().cpu(), y.detach().cpu()
    if scores.ndim == 2 and y.shape == scores.shape:
        v = float(macro_auc(scores, y.double()))
    elif scores.ndim == 2 and y.ndim == 1:
        v = float(multiclass_auc(scores, y.long()))
    else:
        return None
    return None if math.isnan(v) else v


@dataclass
class _View:
    """One model on one batch (at most ``max_samples`` in all): the inputs, its clean logits and, per attack, the
    attacked input and its logits on the attacked input."""

    model: str
    net: nn.Module
    x: Tensor
    y: Tensor
    clean_logits: Tensor
    attacked: list[tuple[Attacked, Tensor, Tensor]]


def _views(nets: dict[str, nn.Module], surrogate: tuple[str, nn.Module] | None, task: Task, data: Any,
           named: list[tuple[str, Any]], target_fn: TargetFn | None, max_samples: int | None) -> Iterator[_View]:
    """White-box (no surrogate): each model attacked on its own. With a surrogate: each batch attacked once on
    it, and every model evaluated (outputs and maps) on those examples."""
    if surrogate is None:
        for mname, net in nets.items():
            seen = 0
            for batch in attacked_batches(net, task, data, named, target_fn):
                take = batch.x.shape[0] if max_samples is None else min(batch.x.shape[0], max_samples - seen)
                yield _View(mname, net, batch.x[:take], batch.y[:take], batch.clean_logits[:take],
                            [(att, att.result.x_adv[:take], att.result.logits[:take]) for att in batch.attacked])
                seen += take
                if max_samples is not None and seen >= max_samples:
                    break
        return
    seen = 0
    for batch in attacked_batches(surrogate[1], task, data, named, target_fn):  # crafted once, on the surrogate
        take = batch.x.shape[0] if max_samples is None else min(batch.x.shape[0], max_samples - seen)
        for mname, net in nets.items():
            dev = model_device(net, batch.x.device)
            x, y = batch.x[:take].to(dev), batch.y[:take].to(dev)
            clean = forward(net, x)
            task.validate(clean, y, "y")
            adv = [(att, att.result.x_adv[:take].to(dev)) for att in batch.attacked]
            yield _View(mname, net, x, y, clean, [(att, xa, forward(net, xa)) for att, xa in adv])
        seen += take
        if max_samples is not None and seen >= max_samples:
            break


def _borrowed(matched: Any, methods: Mapping[str, Explanation]) -> dict[str, str]:
    """``{evaluation-only method label: attacked method name}`` of a ``matched`` mapping (``{}`` for a bool),
    checked against the methods compared and the registered ones."""
    if isinstance(matched, bool):
        return {}
    if not isinstance(matched, Mapping) or not matched:
        raise ValueError(f"`matched` must be True, False or a non-empty {{method: attacked method}} mapping, got "
                         f"{matched!r}")
    known = available_explanations()
    for e, src in matched.items():
        if e not in methods:
            raise ValueError(f"`matched` names {e!r}, which is not one of the `explanations` compared "
                             f"({', '.join(methods)})")
        if not isinstance(src, str) or src not in known:
            raise ValueError(f"`matched[{e!r}]` must name an explanation method the attacks attack ("
                             f"{', '.join(known)}), got {src!r}")
    return {str(e): str(src) for e, src in matched.items()}


def saliency(
    models: nn.Module | Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    explanations: Sequence[str | Mapping[str, Any] | Explanation] | None = None,
    max_samples: int | None = None,
    matched: bool | Mapping[str, str] = False,
    target_fn: TargetFn | None = None,
    surrogate: nn.Module | Mapping[str, nn.Module] | None = None,
) -> StudyResult:
    """How far each explanation method's map moves under each attack, for each model.

    Args:
        models: one model or ``{name: model}`` (Zhang et al. compare two architectures).
        task: the models' task (the explained class comes from :meth:`Task.explained_class`).
        data, attacks, target_fn: as for ``evaluate``.
        explanations: method names or ``{name: ..., **params}`` of :func:`medadv.explain.get_explanation`
            (default: every registered method that needs no parameter; methods that do not apply to the model, e.g. Grad-CAM without a
            convolutional layer, are refused by the method with its own message).
        max_samples: stop after this many samples (default: all of ``data``).
        matched: an attack on an explanation (it has an ``explanation``) is compared on the method it attacked
            only, the cells of Zhang et al.'s Table 2 (the other methods' maps are not computed for it);
            prediction attacks are compared on every method. A mapping ``{method: attacked method}`` does that
            and also compares each evaluation-only method on the images of the attacks on another method, as
            Zhang et al. do for the methods that cannot be attacked (``{"xrai": "integrated_gradients",
            "guided_gradcam": "gradcam"}``); its keys are labels of ``explanations``.
        surrogate: a model, or ``{name: model}`` with one entry, the attacks are crafted on instead of each model
            (Zhang et al.'s Fig. 3, images perturbed on a proxy model): each batch is attacked once, on it, and
            every model of ``models`` is evaluated on those images (its outputs, its AUC and its own maps).

    Returns:
        ``StudyResult("saliency")``: rows ``{model, explanation, attack, budget, ssim, spearman, topk,
        changed, ssim_target, psc, auc_clean, auc_adv}`` (means over the samples; ``changed`` is the fraction whose
        prediction changed;
        ``ssim_target`` the SSIM of the attacked map to the attack's target map, for targeted explanation
        attacks, else ``None``; ``psc`` Zhang et al.'s prediction–saliency correlation: Pearson r over the images
        of the prediction's JSD — of the explained label for multi-label models — and the map's JSD, ``None``
        when undefined; ``auc_clean``/``auc_adv`` the model's dataset AUC (:func:`dataset_auc`) on the clean and
        the attacked images, ``None`` for tasks without class scores); with a ``surrogate`` also ``surrogate`` (its
        name). ``meta["ssim"][model][attack][explanation]`` the mean SSIM (a model × method matrix per attack),
        ``meta["auc"][model][attack]`` ``{"clean", "adv"}``.
    """
    check_task(task)
    nets = check_models({"model": models} if isinstance(models, nn.Module) else models, "models")
    nets = {k: task.logits_model(m) for k, m in nets.items()}  # declared probabilities: logits
    sur: tuple[str, nn.Module] | None = None
    if surrogate is not None:
        named_sur = check_models({"surrogate": surrogate} if isinstance(surrogate, nn.Module) else surrogate,
                                 "surrogate")
        if len(named_sur) != 1:
            raise ValueError(f"`surrogate` must be one model (or {{name: model}} with one entry), got "
                             f"{len(named_sur)}: {', '.join(named_sur)}")
        (sname, smodel), = named_sur.items()
        sur = (sname, task.logits_model(smodel))
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the saliency study compares maps before and after an attack")
    methods = _explanations(explanations)
    borrow = _borrowed(matched, methods)
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"`max_samples` must be >= 1 or None, got {max_samples}")
    sims: dict[tuple[str, int, str], dict[str, list[Tensor]]] = {}
    logits: dict[tuple[str, int | None], list[Tensor]] = {}  # (model, attack index or None: clean) -> logits
    labels: dict[str, list[Tensor]] = {}
    for v in _views(nets, sur, task, data, named, target_fn, max_samples):
        net, x, take = v.net, v.x, v.x.shape[0]
        label = task.explained_class(v.y, v.clean_logits.flatten(2).mean(2) if v.clean_logits.ndim > 2
                                     else v.clean_logits)
        logits.setdefault((v.model, None), []).append(v.clean_logits.detach().cpu())
        labels.setdefault(v.model, []).append(v.y.detach().cpu())
        clean_maps: dict[str, Tensor] = {}  # each method's clean map, computed when an attack first needs it
        c1 = v.clean_logits[:1]  # independent labels ((N, 2, L) distributions): PSC reads the explained one
        lab = label if c1.ndim == 2 and task.distributions(c1, task.predict(c1))[0].ndim == 3 else None
        pred_clean = task.predict(v.clean_logits)
        for i, (att, xa, adv_logits) in enumerate(v.attacked):
            logits.setdefault((v.model, i), []).append(adv_logits.detach().cpu())
            pred_adv = task.predict(adv_logits)
            changed = (pred_clean != pred_adv).reshape(take, -1).any(1).double().cpu()
            # Zhang et al.'s PSC pairs the prediction's JSD (multi-label: of the explained label) with the map's
            d_pred = prediction_jsd(task, v.clean_logits, adv_logits, lab).double().cpu()
            target = getattr(att.result.details, "target_map", None)
            own = getattr(att.attack, "explanation", None) if matched else None
            pairs = methods
            if isinstance(own, Explanation):
                pairs = {e: m for e, m in methods.items() if m.config() == own.config()} or {own.name: own}
                pairs.update({e: methods[e] for e, src in borrow.items() if src == own.name})
            for e, m in pairs.items():
                if e not in clean_maps:
                    clean_maps[e] = m(net, x, label).detach()
                adv_map = m(net, xa, label).detach()
                d = sims.setdefault((v.model, i, e), {k: [] for k in (*SIMILARITIES, "changed", "ssim_target",
                                                                      "d_pred", "d_sal")})
                comp = compare_maps(clean_maps[e], adv_map)
                for k in SIMILARITIES:
                    if k in comp:
                        d[k].append(comp[k].double().cpu())
                d["changed"].append(changed)
                d["d_pred"].append(d_pred)
                d["d_sal"].append(map_jsd(clean_maps[e], adv_map).double().cpu())
                if isinstance(target, Tensor) and target.shape[-adv_map.ndim + 1:] == adv_map.shape[1:]:
                    t = target[:take] if target.ndim == adv_map.ndim else target.expand_as(adv_map)
                    d["ssim_target"].append(map_ssim(adv_map, t.to(adv_map)).double().cpu())
    # the AUCs need every sample's scores: computed once per (model, attack) over the whole run
    auc: dict[tuple[str, int], dict[str, float | None]] = {}
    for mname in nets:
        if mname not in labels:
            continue
        y_all = torch.cat(labels[mname])
        clean_auc = dataset_auc(task, torch.cat(logits[(mname, None)]), y_all)
        for i in range(len(named)):
            auc[(mname, i)] = {"clean": clean_auc, "adv": dataset_auc(task, torch.cat(logits[(mname, i)]), y_all)}
    rows: list[dict[str, Any]] = []
    matrix: dict[str, dict[str, dict[str, float | None]]] = {m: {} for m in nets}
    for (mname, i, e), d in sims.items():
        aname, atk = named[i]
        row: dict[str, Any] = {"model": mname, "explanation": e, "attack": aname, "budget": atk.budget}
        if sur is not None:
            row["surrogate"] = sur[0]
        for k, chunks in d.items():
            if k not in ("d_pred", "d_sal"):
                row[k] = mean(torch.cat(chunks)) if chunks else None
        dp, ds = torch.cat(d["d_pred"]), torch.cat(d["d_sal"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant changes: PSC undefined, written as null
            row["psc"] = psc(dp, ds) if dp.numel() >= 3 else None
        row["auc_clean"], row["auc_adv"] = auc[(mname, i)]["clean"], auc[(mname, i)]["adv"]
        rows.append(row)
        matrix[mname].setdefault(aname, {})[e] = row.get("ssim")
    auc_meta: dict[str, dict[str, dict[str, float | None]]] = {}
    for (mname, i), pair in auc.items():  # by attack name, as meta["ssim"]
        auc_meta.setdefault(mname, {})[named[i][0]] = pair
    meta: dict[str, Any] = {"ssim": matrix, "auc": auc_meta,
                            "explanations": list(dict.fromkeys(r["explanation"] for r in rows)),
                            "similarities": list(SIMILARITIES)}
    if sur is not None:
        meta["surrogate"] = sur[0]
    return StudyResult("saliency", rows, meta)


# --- the report section -------------------------------------------------------------------------------------------
def _draw_saliency(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    """Model × method SSIM heatmaps per attack (Zhang et al. Tables 1–2) and the rows."""
    matrix = study.meta["ssim"]
    methods = list(study.meta.get("explanations") or [])
    models = list(matrix)
    attacks = list(dict.fromkeys(a for m in matrix.values() for a in m))
    blocks: list[Any] = []
    if models and methods and attacks:
        plt = pyplot()
        fig, axes = plt.subplots(1, len(attacks), figsize=(max(4.0, 1.1 * len(methods) + 2) * len(attacks),
                                                           1.0 + 0.6 * len(models)), squeeze=False)
        for ax, a in zip(axes[0], attacks, strict=True):
            m = [[matrix[mo].get(a, {}).get(e) for e in methods] for mo in models]
            heatmap(ax, m, models, methods, title=f"SSIM(clean map, attacked map) · {a}", vmin=0.0, vmax=1.0)
        fig.tight_layout()
        blocks.append(figure_image(fig, "saliency SSIM per model and method",
                                   "1 = the attack left the map as it was; low = the map moved"))
    blocks.extend(_zhang_tables(study.rows, study.meta.get("surrogate")))
    cols = ["model", "explanation", "attack", "budget", "ssim", "spearman", "topk", "changed", "psc",
            "auc_clean", "auc_adv"]
    if any(r.get("ssim_target") is not None for r in study.rows):
        cols.append("ssim_target")
    blocks.append(data_table(study.rows, cols, "mean over the samples; changed: fraction whose prediction changed; "
                             "ssim_target: SSIM of the attacked map to the attack's target map; psc: correlation of the prediction's "
                             "and the map's change over the images (Zhang et al.)"))
    return Section("study-saliency", "Explanations under attack, model × method (Zhang et al.)",
                   "Each method explains the class of the clean prediction on the clean and on the attacked input; "
                   "a prediction attack shows how fragile the maps are (Table 1), an attack on the explanation how "
                   "far a map can be moved while the prediction holds (Table 2).", blocks)


def _zhang_tables(rows: Sequence[Mapping[str, Any]], surrogate: Any) -> list[Any]:
    """Zhang et al.'s layout (Tables 1–2): per model the rows AUC (clean), AUC on the attacked images, SSIM to the
    original map, SSIM to the target map (targeted attacks) and PSC; one column per method (per method and
    attack when a method was compared under several attacks)."""
    if not rows:
        return []
    settings: dict[str, set[tuple[Any, Any]]] = {}
    for r in rows:
        settings.setdefault(str(r["explanation"]), set()).add((r["attack"], r["budget"]))
    cells = list(dict.fromkeys((str(r["explanation"]), r["attack"], r["budget"]) for r in rows))
    label = {c: c[0] if len(settings[c[0]]) == 1 else f"{c[0]} · {setting_key(c[1], c[2])}" for c in cells}
    metrics = [("AUC (clean)", "auc_clean"), ("AUC on the attacked images", "auc_adv"),
               ("SSIM to the original map", "ssim")]
    if any(r.get("ssim_target") is not None for r in rows):
        metrics.append(("SSIM to the target map", "ssim_target"))
    metrics.append(("PSC", "psc"))
    table = []
    for model in dict.fromkeys(str(r["model"]) for r in rows):
        by = {(str(r["explanation"]), r["attack"], r["budget"]): r for r in rows if str(r["model"]) == model}
        for name, col in metrics:
            table.append({"model": model, "metric": name, **{label[c]: by[c].get(col) if c in by else None
                                                             for c in cells}})
    where = (f"the attacked images were crafted on {surrogate} and each model evaluated on them (its own outputs "
             "and maps)" if surrogate is not None else "each model attacked white-box")
    return [data_table(table, ["model", "metric", *label.values()],
                       f"Zhang et al.'s Tables 1–2 per model and method ({where}): the dataset AUC clean and on "
                       "the attacked images, the SSIM of the attacked map to the original and (targeted attacks) "
                       "to the target map, and the prediction–saliency correlation PSC; columns: the method (and "
                       "the attack, where a method met several).")]


# --- the config entry ---------------------------------------------------------------------------------------------
def _needs_class_scores(task: Task) -> str | None:
    """Why ``task`` has no class score to explain (outputs that are values, e.g. regression), or None."""
    if task.class_scores:
        return None
    return "an explanation map explains a class score, and this task's outputs are values, not class scores"


@register_study("saliency", draw=_draw_saliency, needs=_needs_class_scores,
                check_options={"explanations": ["gradient"], "max_samples": 2})
class SaliencySpec(StudySpec):
    """Explanation maps before and after each attack, model × method (Zhang et al. 2024, Tables 1–2):
    :func:`medadv.studies.saliency.saliency`. ``explanations``: method names (default: all registered);
    ``models``: which models (default: all); ``surrogate``: craft the attacks on this model and evaluate the
    others on its examples (Fig. 3)."""

    study: Literal["saliency"]
    explanations: Annotated[list[str | dict[str, Any]], Field(min_length=1)] | None = None
    models: Annotated[list[str], Field(min_length=1)] | None = None
    max_samples: Annotated[int, Strict(), Field(ge=1)] | None = None
    #: True: an attack on an explanation is compared on its own method only (Table 2); ``{method: attacked
    #: method}`` also compares an evaluation-only method on another method's attacked images (XRAI on IG's)
    matched: Annotated[bool, Strict()] | Annotated[dict[str, str], Field(min_length=1)] = False
    #: the model the attacks are crafted on (Zhang et al.'s Fig. 3, a proxy model); every model of ``models`` is
    #: then evaluated on its examples. Default: each model attacked on its own (white-box)
    surrogate: str | None = Field(None, min_length=1)

    @field_validator("explanations")
    @classmethod
    def _known(cls, specs: list[str | dict[str, Any]] | None) -> list[str | dict[str, Any]] | None:
        from ..explain import available_explanations, get_explanation

        known = available_explanations()
        for spec in specs or []:
            n = spec if isinstance(spec, str) else str(spec.get("name"))
            if n in known and isinstance(spec, dict):
                try:
                    get_explanation(spec)  # its parameters, checked now
                except (TypeError, ValueError) as e:
                    raise PydanticCustomError("explanation", "{error}", {"error": str(e)}) from None
            if n not in known:
                raise unknown_option(n, known)
        return specs

    @model_validator(mode="after")
    def _matched_methods(self) -> SaliencySpec:
        if isinstance(self.matched, dict):
            from ..explain import available_explanations

            known = available_explanations()
            labels = known if self.explanations is None else \
                [e if isinstance(e, str) else str(e.get("name")) for e in self.explanations]
            for e, src in self.matched.items():
                if e not in labels:
                    raise PydanticCustomError("matched", "`matched` names {e}, which is not one of the "
                                              "`explanations` ({listed})", {"e": repr(e), "listed": ", ".join(labels)})
                if src not in known:
                    raise unknown_option(src, known)
        return self

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        sur = None if self.surrogate is None else pick_models(models, [self.surrogate], "surrogate")
        return saliency(pick_models(models, self.models, "models"), task, data, attacks if attacks is not None else {},
                        explanations=self.explanations, max_samples=self.max_samples, matched=self.matched,
                        target_fn=target_fn, surrogate=sur)
