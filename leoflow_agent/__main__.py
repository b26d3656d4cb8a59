"""``python -m leoflow_agent serve --socket PATH``: start the Lite zygote (DESIGN §3).
``python -m leoflow_agent pod``: the agent of one Kubernetes task pod (:mod:`leoflow_agent.podmain`).
``python -m leoflow_agent warm-pod``: the agent of one Kubernetes warm pod (:mod:`leoflow_agent.warmpod`).

Nothing secret is accepted on this command line: Lite workloads and tokens arrive over the socket only, and a
task pod's agent reads only public settings from its environment and trades its projected token for the workload.
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
    serve.add_argument("--warm-files", type=int, default=0,
                       help="file workers at most (pre-parsed parents per DAG file); 0: fork every agent here")
    serve.add_argument("--warm-idle-ttl", type=float, default=600.0, help="seconds an idle file worker stays")
    serve.add_argument("--warm-max-age", type=float, default=3600.0, help="seconds after which a file worker retires")
    pod = sub.add_parser("pod", help="run the attempt of this Kubernetes task pod (settings from LEOFLOW_* env)")
    pod.add_argument("--termination-message-path", default=None,
                     help="where the outcome record goes (default: /dev/termination-log, the pinned "
                          "terminationMessagePath); for running the agent outside a pod")
    warm = sub.add_parser("warm-pod", help="serve attempts of one DAG version in this Kubernetes warm pod "
                                           "(settings from LEOFLOW_* env)")
    warm.add_argument("--termination-message-path", default=None,
                      help="where the last attempt's outcome record goes (default: /dev/termination-log); for "
                           "running the agent outside a pod")
    args = parser.parse_args(argv)
    if args.command == "serve":
        from leoflow_agent.zygote import serve_main

        extra = tuple(n.strip() for n in args.preload.split(",") if n.strip())
        return serve_main(args.socket, extra, warm_files=args.warm_files, warm_idle_ttl=args.warm_idle_ttl,
                          warm_max_age=args.warm_max_age)
    if args.command == "pod":
        from leoflow_agent import podmain

        return podmain.main(termination_path=args.termination_message_path or podmain.TERMINATION_MESSAGE_PATH)
    if args.command == "warm-pod":
        from leoflow_agent import podmain, warmpod

        return warmpod.main(termination_path=args.termination_message_path or podmain.TERMINATION_MESSAGE_PATH)
    return 2


if __name__ == "__main__":
    sys.exit(main())
