"""`python -m fp4lab.cli`: the `fp4lab` command."""

from fp4lab.cli import console

console()
