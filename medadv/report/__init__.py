"""Plots, Markdown and self-contained HTML reports of evaluation results."""

from .cases import Case, SaliencyPair, make_cases, select_cases, worst_cases
from .html import write_html_report
from .markdown import write_report
from .plots import headline_metric, plot_robustness_curve

__all__ = ["write_report", "write_html_report", "plot_robustness_curve", "headline_metric", "Case", "SaliencyPair",
           "make_cases", "select_cases", "worst_cases"]
