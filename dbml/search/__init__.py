"""Hyper-parameter search: the engine, studies, trials, fused trials and stacking."""
