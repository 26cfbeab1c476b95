"""`python -m project sweep`: Optuna hyperparameter search over fit's own options.

settings (the `sweep:` section and `--sweep.*` flags, checked), command (the study and its trials, each
an ordinary `fit` in a subprocess), summary (best.yaml, the ready fit command, the study's pictures).
trial (the fit side of a trial: a callback that `sweep` adds to each trial's fit).
"""
