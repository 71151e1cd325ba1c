"""``join`` of a command line (upstream's ``torchx.util.shlex``): the stdlib's."""

from shlex import join as join  # noqa: F401
