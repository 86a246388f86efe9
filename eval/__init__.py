"""Evaluations of trained runs: score.py (shared loading and scoring), extrapolate.py, compare.py."""
