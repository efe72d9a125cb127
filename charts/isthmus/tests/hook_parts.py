#!/usr/bin/env python3
"""Helpers for lint.sh's uninstall-hook check.
  hook_parts.py HOOK.yaml rbac OUT.yaml         writes every rendered object but the Job;
  hook_parts.py HOOK.yaml args                  prints the Job's container args, one per line (the
                                                ServiceAccount's name on stderr), after checking that the Job
                                                runs the operator image non-root with a read-only root;
  hook_parts.py KUBECONFIG impersonate OUT USER writes a copy of KUBECONFIG whose users impersonate USER."""
import sys
import yaml

if sys.argv[2] == "impersonate":
    config = yaml.safe_load(open(sys.argv[1]))
    for user in config["users"]:
        user["user"]["as"] = sys.argv[4]
    with open(sys.argv[3], "w") as f:
        yaml.safe_dump(config, f)
    sys.exit(0)

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
if sys.argv[2] == "rbac":
    with open(sys.argv[3], "w") as f:
        yaml.safe_dump_all([d for d in docs if d["kind"] != "Job"], f)
else:
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    problems = []
    if "/isthmus-operator:" not in container["image"]:
        problems.append(f"image {container['image']} is not the operator image")
    if container["args"][0] != "uninstall":
        problems.append(f"args {container['args']} do not run `isthmus-operator uninstall`")
    if not pod["securityContext"].get("runAsNonRoot"):
        problems.append("securityContext.runAsNonRoot is not true")
    if not container["securityContext"].get("readOnlyRootFilesystem"):
        problems.append("container securityContext.readOnlyRootFilesystem is not true")
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules = {tuple(r["resources"]): sorted(r["verbs"]) for r in role["rules"]}
    want = {("networklinks",): ["delete", "list", "watch"], ("networktopologies",): ["delete", "list"],
            ("pods",): ["list"]}
    args = container["args"]
    policy = args[args.index("--gated-pods") + 1] if "--gated-pods" in args else None
    if policy not in ("refuse", "release"):
        problems.append(f"args {args} name no --gated-pods refuse|release")
    # Only a hook that releases gated pods writes to them.
    if policy == "release":
        want[("pods/status",)] = ["patch"]
    if rules != want:
        problems.append(f"ClusterRole rules {rules}, want exactly {want}")
    if problems:
        sys.exit("uninstall hook: " + "; ".join(problems))
    print("\n".join(container["args"]))
    print(pod["serviceAccountName"], file=sys.stderr)
