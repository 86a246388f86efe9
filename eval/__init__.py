"""Evaluations of trained runs: extrapolate.py (scoring in score.py), compare.py."""
