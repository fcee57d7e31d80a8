"""``medadv demo``: deepbet (pretrained, its own weights) attacked on the real Colin27 head, ε in grey levels."""

from __future__ import annotations

import pytest
import torch

from medadv.cli import main
from medadv.data import heads
from medadv.demo_deepbet import (
    BOUNDS,
    DeepbetDemoConfig,
    RandomSign,
    build_model,
    demo_attacks,
    load_subject,
    run_deepbet_demo,
    write_deepbet_outputs,
)
from medadv.tasks import Segmentation
from medadv.threats import Linf

HAS_COLIN = (heads.MRICRON_DIR / "ch2.nii.gz").is_file()
needs_colin = pytest.mark.skipif(not HAS_COLIN, reason="Debian mricron-data not installed (apt-get install mricron-data)")
TASK = Segmentation(2, outputs="probabilities")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The whole demo at 32³ (the smallest grid deepbet's UNet takes), one step, ε = 4, with its outputs."""
    said: list[str] = []
    out = run_deepbet_demo(DeepbetDemoConfig(size=32, steps=1, budgets=(4.0,), device="cpu"), progress=False,
                           echo=said.append)
    folder = tmp_path_factory.mktemp("demo")
    paths = write_deepbet_outputs(out, folder)
    return out, said, paths


@pytest.fixture(scope="module")
def demo_size():
    """Colin27 and the bbox stage at the demo's size (96³), fitted on the clean image."""
    head = load_subject()
    cfg = DeepbetDemoConfig(device="cpu")
    model = build_model(cfg).fit(head.batch())
    return head, cfg, model


@needs_colin
def test_demo_runs_end_to_end_prints_the_table_and_writes_the_report(tiny_run):
    out, said, paths = tiny_run
    table = next(s for s in said if s.startswith("Dice of the attacked brain mask"))
    lines = table.splitlines()
    assert "Dice→clean" in lines[1] and "Dice→ref" in lines[1] and "ΔTIV ml" in lines[1]
    body = [ln.split()[0] for ln in lines[3:]]
    assert body == ["clean", "fgsm", "pgd", "cospgd", "segpgd", "volume", "noise"]
    assert lines[3].split()[2] == "1.0000"  # the clean mask against itself
    assert any("deepbet" in s and "pretrained" in s for s in said)
    names = {p.name for p in paths}
    assert {"results.json", "results.csv", "table.md", "report.md", "report.html"} <= names
    html = next(p for p in paths if p.name == "report.html").read_text()
    assert "<img" in html.split("<h2>Cases", 1)[1]  # the three-plane figure of the mask change
    assert "255/255" not in html  # ε in grey levels, not misread as a fraction of [0, 1]


@needs_colin
def test_every_demo_attack_stays_in_its_grey_level_ball_and_the_data_range(tiny_run):
    out = tiny_run[0]
    model, x, y = out["model"], out["x"], out["y"]
    before = x.clone()
    cfg = DeepbetDemoConfig(size=32, steps=2, budgets=(1.0, 8.0), device="cpu")
    attacks = demo_attacks(TASK, cfg, 0.001)
    assert {n.split("@")[0] for n in attacks} == {"fgsm", "pgd", "cospgd", "segpgd", "volume", "noise"}
    for name, atk in attacks.items():
        eps = float(name.split("@")[1])
        adv = atk(model, x, y).x_adv
        assert float((adv - x).abs().max()) <= eps + 1e-4, name
        assert float((adv - x).abs().max()) >= 0.5 * eps, name  # it used its budget
        assert float(adv.min()) >= BOUNDS[0] and float(adv.max()) <= BOUNDS[1], name
    assert torch.equal(x, before)  # the caller's image is never modified


def test_random_sign_control_moves_every_voxel_by_eps_inside_the_box():
    x = torch.tensor([[[0.0, 1.0, 100.0, 254.0, 255.0, 30.0]]])
    noise = RandomSign(Segmentation(2), Linf(4.0, bounds=BOUNDS), seed=3)
    d = noise.draw(x)
    assert set(d.abs().flatten().tolist()) == {4.0} and {-4.0, 4.0} <= set(d.flatten().tolist()) | {-4.0, 4.0}
    assert torch.equal(d, RandomSign(Segmentation(2), Linf(4.0, bounds=BOUNDS), seed=3).draw(x))  # seeded
    adv = noise.perturb(torch.nn.Identity(), x, torch.zeros(1, 6, dtype=torch.long), None)
    assert float(adv.min()) >= 0 and float(adv.max()) <= 255
    inner = (x > 4) & (x < 251)
    assert torch.equal((adv - x).abs()[inner], torch.full_like(x[inner], 4.0))


@needs_colin
def test_pgd_at_4_grey_levels_hurts_5x_more_than_noise_and_the_volume_attack_moves_tiv_more(demo_size):
    from medadv.demo_deepbet import table_rows
    from medadv.evaluation import evaluate

    head, cfg, model = demo_size
    attacks = demo_attacks(TASK, cfg, head.voxel_ml)
    chosen = {k: attacks[k] for k in ("pgd@4", "noise@4", "pgd@8", "volume@8")}
    res = evaluate(model, TASK, (head.batch(), head.mask[None].long()), chosen, spacing=head.spacing, seed=0)
    rows = {f"{r['attack']}@{r['eps']:g}": r for r in table_rows(res)[1:]}
    drop = {k: 1 - r["dice_clean"] for k, r in rows.items()}
    assert drop["noise@4"] > 0  # the control does something, so the ratio means something
    assert drop["pgd@4"] >= 5 * drop["noise@4"], drop
    assert abs(rows["volume@8"]["tiv_change_ml"]) > abs(rows["pgd@8"]["tiv_change_ml"]), rows


def test_missing_mricron_data_is_one_line_before_any_model_work(monkeypatch, tmp_path, capsys):
    import medadv.demo_deepbet as demo

    monkeypatch.setattr(heads, "MRICRON_DIR", tmp_path)
    monkeypatch.setattr(demo, "build_model", lambda cfg: pytest.fail("the model was built before the data check"))
    with pytest.raises(FileNotFoundError, match="apt-get install mricron-data"):
        run_deepbet_demo(DeepbetDemoConfig(device="cpu"), progress=False, echo=lambda s: None)
    assert main(["demo", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medadv: error: ") and "apt-get install mricron-data" in err[0]
    assert "Traceback" not in err[0]


@pytest.mark.parametrize("argv,words", [(["--size", "48"], "multiple of 32"), (["--steps", "0"], "`steps`")])
def test_demo_refuses_bad_arguments_in_one_line(argv, words, capsys, monkeypatch):
    import medadv.demo_deepbet as demo

    monkeypatch.setattr(demo, "load_subject", lambda *a: pytest.fail("work started before the arguments were checked"))
    assert main(["demo", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_demo_unet_flag_keeps_the_trained_unet_demo_reachable(monkeypatch):
    import medadv.demo as unet_demo
    import medadv.demo_deepbet as demo

    seen = {}

    def fake_run(cfg, **kw):
        seen["cfg"] = cfg
        return {}

    monkeypatch.setattr(unet_demo, "run_demo", fake_run)
    monkeypatch.setattr(demo, "run_deepbet_demo", lambda *a, **k: pytest.fail("--unet ran the deepbet demo"))
    assert main(["demo", "--unet", "--epochs", "3", "--steps", "2", "--n-test", "1", "--no-progress"]) == 0
    cfg = seen["cfg"]
    assert isinstance(cfg, unet_demo.DemoConfig) and (cfg.epochs, cfg.steps, cfg.n_test) == (3, 2, 1)
