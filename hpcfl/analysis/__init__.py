"""Offline analysis of result files: HDF5 in, pandas DataFrames and text tables out. Never imports
the runtime; `python -m hpcfl.analyze` is its command line."""
from hpcfl.analysis.results import Results, find_files, load, tidy
from hpcfl.analysis.tables import render, rounds_to_target, summary

__all__ = ["Results", "find_files", "load", "tidy", "summary", "rounds_to_target", "render"]
