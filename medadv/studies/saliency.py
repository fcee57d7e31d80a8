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

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..explain import Explanation, available_explanations, get_explanation
from ..metrics.saliency import compare_maps, map_jsd, map_ssim, prediction_jsd, psc
from ..tasks import Task
from ._common import AttackSpec, TargetFn, attacked_batches, check_models, check_task, mean, named_attacks
from .base import StudyResult

__all__ = ["saliency"]

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


def saliency(
    models: nn.Module | Mapping[str, nn.Module],
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    explanations: Sequence[str | Mapping[str, Any] | Explanation] | None = None,
    max_samples: int | None = None,
    matched: bool = False,
    target_fn: TargetFn | None = None,
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
            prediction attacks are compared on every method.

    Returns:
        ``StudyResult("saliency")``: rows ``{model, explanation, attack, budget, ssim, spearman, topk,
        changed, ssim_target}`` (means over the samples; ``changed`` is the fraction whose prediction changed;
        ``ssim_target`` the SSIM of the attacked map to the attack's target map, for targeted explanation
        attacks, else ``None``; ``psc`` Zhang et al.'s prediction–saliency correlation: Pearson r over the images
        of the prediction's JSD — of the explained label for multi-label models — and the map's JSD, ``None``
        when undefined); ``meta["ssim"][model][attack][explanation]`` the mean SSIM (a model × method
        matrix per attack).
    """
    check_task(task)
    nets = check_models({"model": models} if isinstance(models, nn.Module) else models, "models")
    nets = {k: task.logits_model(m) for k, m in nets.items()}  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the saliency study compares maps before and after an attack")
    methods = _explanations(explanations)
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"`max_samples` must be >= 1 or None, got {max_samples}")
    rows: list[dict[str, Any]] = []
    matrix: dict[str, dict[str, dict[str, float | None]]] = {}
    for mname, net in nets.items():
        sims: dict[tuple[int, str], dict[str, list[Tensor]]] = {}
        seen = 0
        for batch in attacked_batches(net, task, data, named, target_fn):
            take = batch.x.shape[0] if max_samples is None else min(batch.x.shape[0], max_samples - seen)
            x = batch.x[:take]
            label = task.explained_class(batch.y[:take], batch.clean_logits[:take].flatten(2).mean(2)
                                         if batch.clean_logits.ndim > 2 else batch.clean_logits[:take])
            clean_maps: dict[str, Tensor] = {}  # each method's clean map, computed when an attack first needs it
            c1 = batch.clean_logits[:1]  # independent labels ((N, 2, L) distributions): PSC reads the explained one
            lab = label if c1.ndim == 2 and task.distributions(c1, task.predict(c1))[0].ndim == 3 else None
            pred_clean = task.predict(batch.clean_logits[:take])
            for i, att in enumerate(batch.attacked):
                xa = att.result.x_adv[:take]
                pred_adv = task.predict(att.result.logits[:take])
                changed = (pred_clean != pred_adv).reshape(take, -1).any(1).double().cpu()
                # Zhang et al.'s PSC pairs the prediction's JSD (multi-label: of the explained label) with the map's
                d_pred = prediction_jsd(task, batch.clean_logits[:take], att.result.logits[:take], lab).double().cpu()
                target = getattr(att.result.details, "target_map", None)
                own = getattr(att.attack, "explanation", None) if matched else None
                pairs = ({e: m for e, m in methods.items() if m.config() == own.config()} or {own.name: own}
                         if isinstance(own, Explanation) else methods)
                for e, m in pairs.items():
                    if e not in clean_maps:
                        clean_maps[e] = m(net, x, label).detach()
                    adv_map = m(net, xa, label).detach()
                    d = sims.setdefault((i, e), {k: [] for k in (*SIMILARITIES, "changed", "ssim_target", "d_pred",
                                                                 "d_sal")})
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
            seen += take
            if max_samples is not None and seen >= max_samples:
                break
        matrix[mname] = {}
        for (i, e), d in sims.items():
            aname, atk = named[i]
            row: dict[str, Any] = {"model": mname, "explanation": e, "attack": aname, "budget": atk.budget}
            for k, chunks in d.items():
                if k not in ("d_pred", "d_sal"):
                    row[k] = mean(torch.cat(chunks)) if chunks else None
            dp, ds = torch.cat(d["d_pred"]), torch.cat(d["d_sal"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # constant changes: PSC undefined, written as null
                row["psc"] = psc(dp, ds) if dp.numel() >= 3 else None
            rows.append(row)
            matrix[mname].setdefault(aname, {})[e] = row.get("ssim")
    return StudyResult("saliency", rows, {"ssim": matrix,
                                          "explanations": list(dict.fromkeys(r["explanation"] for r in rows)),
                                          "similarities": list(SIMILARITIES)})
