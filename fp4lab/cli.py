"""The `fp4lab` command."""

from __future__ import annotations

import argparse
import sys

import fp4lab


def _formats(_args) -> int:
    print(f"fp4lab {fp4lab.__version__}")
    print("element formats:", ", ".join(fp4lab.format_names()))
    return 0


def _demo(_args) -> int:
    from fp4lab import demo

    return demo.main()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fp4lab", description=fp4lab.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fp4lab {fp4lab.__version__}")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("formats", help="list the element formats").set_defaults(func=_formats)
    sub.add_parser("demo", help="formats, a quantized model, telemetry").set_defaults(func=_demo)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        return _formats(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
