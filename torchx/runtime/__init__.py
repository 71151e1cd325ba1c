"""Upstream's ``torchx.runtime`` namespace: helpers an app uses at run time."""
