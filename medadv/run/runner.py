"""A :class:`Run`: a :class:`~medadv.run.Plan` evaluated into an output folder, resumed when it holds this config's
results, sharded under ``torchrun`` (:mod:`medadv.distributed`: every process evaluates its shard, rank 0 writes).

What ``medadv evaluate`` does, for Python::

    from medadv.run import Run

    outcome = Run.from_yaml("config.yaml").execute()
    print(outcome.results.format_summary(), outcome.paths)
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .output import (
    ADVERSARIAL_DIR,
    ATTACK_CACHE_DIR,
    Action,
    adopt,
    check_adversarial_links,
    check_output,
    output_error,
    prepare_output,
    row_fingerprints,
)
from .plan import Plan

if TYPE_CHECKING:
    from ..results import Results
    from ..studies.base import StudyResult

__all__ = ["Run", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Run.execute` gives back."""

    #: every row of the evaluation (on rank 0 of a sharded run: all ranks' rows)
    results: Results
    #: the studies' results, in the config's order (rank 0 only; other ranks: none)
    studies: list[StudyResult]
    #: the files written (rank 0 only): results.json, results.csv, report.md, report.html, study_*.json
    paths: list[Path]
    #: the output folder
    out: Path
    #: what was done with the folder: "new", "resume", "adopt" (logs of a killed run) or "replace"
    action: Action
    #: the config and data fingerprint kept in run.json
    fingerprint: str


@contextlib.contextmanager
def _attack_once(out: Path) -> Iterator[None]:
    """Every adversarial example attacked once for the whole run (evaluation, studies, report cases); what does not
    fit in memory is spilled into ``out/.attack_cache`` (each rank's cache names its own files), opened without
    following a link below ``out``. This rank's files are deleted when the block ends; :meth:`Run.execute`
    removes the folder once every rank is done.

    Under ``torchrun`` each rank's cache is its own (process memory, its own files): rank 0's studies and report
    cases find only the samples rank 0 evaluated, and craft the other ranks' samples again."""
    from ..attack_cache import AttackCache, attack_once

    cache = AttackCache(spill_dir=out / ATTACK_CACHE_DIR, root=out)
    try:
        with attack_once(cache):
            yield
    finally:
        cache.clear()


class Run:
    """A plan run into an output folder: resume, adoption, overwrite and link policy, ``run.json``, sharding, the
    evaluation, the studies and the reports. ``medadv evaluate`` is ``Run(plan, --output).execute()``.

    Args:
        plan: the checked config (:class:`~medadv.run.Plan`).
        out: the output folder (relative to the working directory); default: the config's ``output``, relative to
            its folder.
        overwrite: replace results of another config or data in ``out`` (default: stop; results of the same
            config and data are resumed).
        progress: progress bars.
    """

    def __init__(self, plan: Plan, out: str | os.PathLike | None = None, *, overwrite: bool = False,
                 progress: bool = True) -> None:
        if not isinstance(plan, Plan):
            raise TypeError(f"Run: `plan` must be a medadv.run.Plan (Plan.from_yaml(path)); got {type(plan).__name__}")
        if out is not None and not isinstance(out, str | os.PathLike):
            raise TypeError(f"Run: `out` must be a folder path or None; got {type(out).__name__}")
        if not isinstance(overwrite, bool):
            raise TypeError(f"Run: `overwrite` must be True or False; got {overwrite!r}")
        if not isinstance(progress, bool):
            raise TypeError(f"Run: `progress` must be True or False; got {progress!r}")
        self.plan = plan
        self.out = Path(out) if out is not None else plan.output_dir
        self.overwrite = overwrite
        self.progress = progress

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, out: str | os.PathLike | None = None, *, allow_code: bool = False,
                  overwrite: bool = False, progress: bool = True) -> Run:
        """``Run(Plan.from_yaml(path, allow_code=allow_code), out, ...)``."""
        return cls(Plan.from_yaml(path, allow_code=allow_code), out, overwrite=overwrite, progress=progress)

    def execute(self) -> Outcome:
        """Evaluate the plan into the output folder, then (rank 0) the results, studies and reports.

        Everything the config names is checked before any model is built; the folder is touched only once the model
        and the data are ready (a failed start leaves it as it was). A second ``execute()`` into the same folder
        resumes: rows already logged are read back, not computed again. An operating-system error while writing is
        one line naming the path (``OSError``)."""

        from .. import distributed
        from ..evaluation import evaluate

        plan, cfg, out = self.plan, self.plan.config, self.out
        task, attacks, target_fn, names = plan.prepare()
        fingerprint = plan.fingerprint()
        distributed.init_from_env()  # torchrun: join the process group; alone: nothing
        cached = False  # the attack-once cache's folder is ours to remove only once the run has made it
        try:
            action = check_output(out, fingerprint, self.overwrite)  # every rank decides before rank 0 acts
            model = plan.model(task, distributed.device())  # seeded with the config's seed, as build() does
            data = plan.loader(task)
            if action == "adopt":  # logs without run.json: resumed if every row is this config's (every rank decides)
                action = adopt(out, fingerprint, row_fingerprints(
                    model, task, attacks, target_fn, hd95=cfg.hd95, spacing=cfg.spacing, seed=cfg.seed,
                    save=cfg.save_adversarial))
            if cfg.save_adversarial and action != "replace":  # overwrite removes the folder, links and all
                check_adversarial_links(out)
            distributed.barrier()
            if distributed.is_main():
                prepare_output(out, action, {
                    "fingerprint": fingerprint, "config": self._source(),
                    "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
                if action == "resume":
                    print(f"resuming into {out} (results of the same config and data are there)", file=sys.stderr)
                elif action == "adopt":
                    print(f"resuming into {out}: it has no run.json (a killed run?), and every row of its logs comes "
                          "from this config", file=sys.stderr)
            distributed.barrier()  # the folder is ready before any rank logs into it
            cached = True
            with _attack_once(out):
                outcome = self._evaluate(evaluate, model, task, data, attacks, target_fn, names, action, fingerprint)
            distributed.barrier()  # every rank is done with the cache
            return outcome
        except OSError as e:  # a full disk, a read-only folder: one line naming the path, not two tracebacks
            err = output_error(e, out)
            if err is e:
                raise
            raise err from e
        finally:
            if cached and distributed.is_main():  # the cache is the run's, never a result: gone, whatever happened
                shutil.rmtree(out / ATTACK_CACHE_DIR, ignore_errors=True)
            distributed.destroy()

    def _source(self) -> str | None:
        return str(self.plan.source.resolve()) if self.plan.source is not None else None

    def _evaluate(self, evaluate: Any, model: Any, task: Any, data: Any, attacks: Any, target_fn: Any,
                  names: list[str] | None, action: Action, fingerprint: str) -> Outcome:
        """The evaluation on every rank; then, on rank 0, the results, studies, cases and reports."""
        from .. import distributed
        from ..attack_cache import seed_tag
        from ..config import model_name
        from ..report import worst_cases, write_html_report, write_report

        plan, cfg, out = self.plan, self.plan.config, self.out
        settings = {k: v for k, v in plan.to_dict().items() if k != "_dir"}
        res = evaluate(model, task, data, attacks, log=out / "log.jsonl", progress=self.progress,
                       target_fn=target_fn, hd95=cfg.hd95, spacing=cfg.spacing, seed=cfg.seed,
                       save_adversarial=out / ADVERSARIAL_DIR if cfg.save_adversarial else None,
                       meta={"config": self._source(), "model": model_name(cfg.model),
                             "config_fingerprint": fingerprint, "settings": settings,
                             **({"classes": names} if names else {})})
        if not distributed.is_main():
            return Outcome(results=res, studies=[], paths=[], out=out, action=action, fingerprint=fingerprint)
        res.to_json(out / "results.json")
        res.to_csv(out / "results.csv")
        paths = [out / "results.json", out / "results.csv", write_report(res, out)]
        with seed_tag(cfg.seed):  # the studies' crafts keyed like evaluate's (seed=cfg.seed): its examples reused
            studies = self._studies(model, task, data, attacks, target_fn, paths)
        report = cfg.report
        # the most-damaged samples of each attack, attacked again under evaluate's per-batch seed to draw them
        cases = worst_cases(model, task, data, attacks, res, k=cfg.cases, seed=cfg.seed, target_fn=target_fn,
                            class_names=names, spacing=cfg.spacing,
                            window=report.window if report is not None else None) if cfg.cases else []
        html = write_html_report(res, out, studies=studies, cases=cases, class_names=names,
                                 title=(report.title if report is not None else None) or plan.title,
                                 results_title=report.results if report is not None else None)
        paths.append(Path(html))
        return Outcome(results=res, studies=studies, paths=paths, out=out, action=action, fingerprint=fingerprint)

    def _studies(self, model: Any, task: Any, data: Any, attacks: Any, target_fn: Any,
                 paths: list[Path]) -> list[Any]:
        """The config's ``studies:`` (rank 0 only), each saved as ``study_<i>_<name>.json`` beside the results."""
        plan = self.plan
        if not plan.studies:
            return []
        from ..studies import run_study

        models = plan.extra_models(model, task)
        done = []
        for i, spec in enumerate(plan.studies):
            print(f"study {spec.study} ...", file=sys.stderr)
            # a copy: run_study records the folder its data paths start from on the spec, and the plan is not ours
            result = run_study(spec.study, spec.model_copy(), models, task, data, attacks, target_fn=target_fn,
                               base_dir=plan.base_dir)
            path = self.out / f"study_{i}_{spec.study}.json"
            result.to_json(path)
            paths.append(path)
            done.append(result)
        return done
