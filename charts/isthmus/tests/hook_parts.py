#!/usr/bin/env python3
"""Splits the rendered uninstall hook: `rbac OUT.yaml` writes every object but the Job; `args` prints the Job's
container args, one per line (lint.sh runs them with kubectl, impersonating the hook's ServiceAccount)."""
import sys
import yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
if sys.argv[2] == "rbac":
    with open(sys.argv[3], "w") as f:
        yaml.safe_dump_all([d for d in docs if d["kind"] != "Job"], f)
else:
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    print("\n".join(container["args"]))
    print(job["spec"]["template"]["spec"]["serviceAccountName"], file=sys.stderr)
