"""Builtin components: plain functions returning an ``AppDef`` (``torchx builtins`` lists them).

``utils.*`` are small helpers (echo, sh, python, copy, ...); ``dist.ddp`` and
``dist.spmd`` launch distributed PyTorch through torchrun.
"""
