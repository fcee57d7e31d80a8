"""Case figures inside a study's section: ``case_meta`` turns cases into PNG entries of ``meta["cases"]`` and the
report shows one figure per entry after the study's own blocks (any study, no drawer change)."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from medadv.report.cases import case_meta, make_cases
from medadv.report.html import render_html_report
from medadv.studies.base import StudyResult
from medadv.tasks import MultiClass, Segmentation


def _cases(k: int = 2) -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 12, 12, generator=g)
    x_adv = (x + 0.05 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    clean = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]])
    adv = torch.tensor([[0.0, 3.0, 0.0], [0.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    return make_cases(MultiClass(), x, x_adv, clean, adv, torch.tensor([0, 1, 2]), k=k, title="FGSM on B")


def _study(meta_cases) -> StudyResult:
    rows = [{"model": m, "clean": 0.9, "attack": "pgd", "budget": 8 / 255, "adv": 0.2} for m in ("a", "b")]
    return StudyResult("models", rows, {"metric": "accuracy", "cases": meta_cases})


def test_case_meta_gives_json_png_entries():
    cases = _cases()
    entries = case_meta(cases)
    assert [e["title"] for e in entries] == [c.title for c in cases]
    assert entries[0]["title"].startswith("FGSM on B · sample ")
    assert [e["note"] for e in entries] == [c.note for c in cases] and entries[0]["note"]
    for e in entries:
        png = base64.b64decode(e["png"], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        # the stored size is the image's (its IHDR)
        assert (e["width"], e["height"]) == (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big"))
    json.loads(json.dumps(entries))  # strict JSON, as the study files are written


def test_a_3d_segmentation_case_is_rendered():
    y = torch.zeros(1, 8, 8, 8, dtype=torch.long)
    y[0, 2:6, 2:6, 2:6] = 1
    x = y.unsqueeze(1).float() * 0.8
    logits = torch.nn.functional.one_hot(y, 2).movedim(-1, 1).float() * 5
    adv = logits.flip(1)
    (entry,) = case_meta(make_cases(Segmentation(2), x, x + 0.01, logits, adv, y, k=1))
    assert entry["height"] > entry["width"] / 3  # three rows: the three orthogonal planes


def test_bad_input_to_case_meta_is_refused():
    with pytest.raises(TypeError, match="`cases`"):
        case_meta(_cases()[0])
    with pytest.raises(TypeError, match="`cases`.*item 1"):
        case_meta([_cases()[0], "not a case"])


def test_study_section_shows_its_cases_after_its_own_blocks():
    entries = case_meta(_cases())
    html = render_html_report(None, studies=[_study(entries)])
    for e in entries:
        tag = f'src="data:image/png;base64,{e["png"]}"'
        assert tag in html
        assert f'alt="case: {e["title"]}"' in html
    # after the drawer's own blocks: the section ends with the case figures, in order
    from medadv.report.html import _study_section

    blocks = _study_section(_study(entries), None).blocks
    assert len(blocks) > len(entries)
    assert [getattr(b, "alt", None) for b in blocks[-len(entries):]] == [f"case: {e['title']}" for e in entries]
    assert not any(str(getattr(b, "alt", "")).startswith("case:") for b in blocks[:-len(entries)])
    assert entries[0]["note"] in html  # the caption: the metric before and after
    # without meta["cases"] a study has no case figure
    plain = _study(None)
    del plain.meta["cases"]
    assert "alt=\"case:" not in render_html_report(None, studies=[plain])


def test_malformed_entries_are_not_embedded():
    good = case_meta(_cases(1))[0]
    hostile = [{**good, "png": 'AAAA" onerror="alert(1)'}, {**good, "width": True}, "text", good]
    html = render_html_report(None, studies=[_study(hostile)])
    assert "onerror" not in html and html.count('alt="case:') == 1
    assert "3 case figure(s) of this study could not be shown" in html
