"""``python -m leoflow_agent serve --socket PATH``: start the Lite zygote (DESIGN §3).

Nothing secret is accepted on this command line: workloads and tokens arrive over the socket only.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the exit code (2 for a usage error)."""
    parser = argparse.ArgumentParser(prog="python -m leoflow_agent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the Lite zygote on a Unix socket")
    serve.add_argument("--socket", required=True, help="path of the 0600 Unix socket to listen on")
    serve.add_argument("--preload", default="", help="comma-separated extra modules to import before serving")
    args = parser.parse_args(argv)
    if args.command == "serve":
        from leoflow_agent.zygote import serve_main

        extra = tuple(n.strip() for n in args.preload.split(",") if n.strip())
        return serve_main(args.socket, extra)
    return 2


if __name__ == "__main__":
    sys.exit(main())
