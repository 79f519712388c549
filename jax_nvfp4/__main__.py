"""Command line: `python -m jax_nvfp4 demo` or `python -m jax_nvfp4 selftest`."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_nvfp4", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="the selftest, then Llama-3-8B-shaped weights quantized "
                        "(error, speed of quantize and matmul) and a Flax MLP converted to NVFP4")
    commands.add_parser("selftest", help="check every CUDA kernel path against the reference")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from jax_nvfp4 import demo

        demo.run()
        return 0
    from jax_nvfp4.selftest import selftest

    return 0 if all(r.ok for r in selftest()) else 1


if __name__ == "__main__":
    sys.exit(main())
