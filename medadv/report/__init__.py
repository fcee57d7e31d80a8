"""Plots and Markdown reports of evaluation results."""

from .markdown import write_report
from .plots import headline_metric, plot_robustness_curve

__all__ = ["write_report", "plot_robustness_curve", "headline_metric"]
