"""Plots, Markdown and self-contained HTML reports of evaluation results."""

from . import blocks
from .cases import Case, SaliencyPair, make_cases, select_cases, worst_cases
from .html import write_html_report
from .markdown import write_report
from .plots import headline_metric, plot_robustness_curve

# `blocks`: the public building blocks of a report section (a study's drawer imports them from there)
__all__ = ["blocks", "write_report", "write_html_report", "plot_robustness_curve", "headline_metric", "Case", "SaliencyPair",
           "make_cases", "select_cases", "worst_cases"]
