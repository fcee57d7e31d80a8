"""``import medadv`` is cheap: names and subpackages load on first use, optional heavy stacks only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import medadv

# optional stacks that only some features need (explanations, plots, toolkits, real-data loaders)
HEAVY = ("captum", "matplotlib", "art", "foolbox", "torchattacks", "robustbench", "autoattack", "pyautoattack",
         "nilearn", "pydicom", "skimage", "pandas", "nibabel", "monai", "scipy", "yaml")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return [m for m in out.strip().split(",") if m]


def test_import_medadv_loads_no_optional_stack():
    assert _loaded_after("import medadv") == []


def test_core_modules_load_no_optional_stack_at_import():
    # every attack module is imported (and registered) here: none may import a toolkit at module import
    code = ("import medadv\n"
            "from medadv import PGD, APGD, AutoAttack, evaluate, Results, data, explain, defenses, metrics, models\n"
            "import medadv.attacks, medadv.training, medadv.report, medadv.cli, medadv.config, medadv.frequency\n"
            "import medadv.models.sliding, medadv.data.brain_patches, medadv.data.chest_xray, medadv.data.mni152\n"
            "assert len(medadv.available_attacks()) >= 12")
    assert _loaded_after(code) == []


def test_every_public_name_resolves_lazily():
    from medadv import PGD, data, evaluate, explain  # the forms users write
    from medadv.attacks.pgd import PGD as PGD_
    from medadv.evaluation import evaluate as evaluate_

    assert PGD is PGD_ and evaluate is evaluate_ and data.__name__ == "medadv.data" and explain.__name__ == "medadv.explain"
    for name in medadv.__all__:
        assert getattr(medadv, name) is not None, name
        assert name in dir(medadv)
    assert medadv.APGD.__module__ == "medadv.attacks.apgd"
    assert medadv.GAPTrainer.__name__ == "GAPTrainer" and medadv.Box.__name__ == "Box"
    assert medadv.threats.__name__ == "medadv.threats"  # any subpackage, before anyone imported it
    # the registry is complete as soon as any attack name is used
    assert {"pgd", "dag", "vafa", "gap", "autoattack"} <= set(medadv.available_attacks())
    with pytest.raises(AttributeError, match="no attribute 'PDG'"):
        medadv.PDG  # noqa: B018


def test_models_metrics_and_data_do_not_import_the_attacks():
    # no package cycle: attacks -> models (GAP's generators) is the only direction
    code = ("import sys\nimport medadv.models, medadv.models.sliding, medadv.metrics, medadv.data, medadv.frequency\n"
            "print('medadv.attacks' in sys.modules, 'medadv.training' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]
