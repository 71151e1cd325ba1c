"""Builtin components: plain functions returning an ``AppDef`` (``torchx builtins`` lists them)."""
