#!/usr/bin/env python3
"""The GitHub workflows against the Makefile and .ci/run (run by `make unit`).

A pull request should be judged by what `make test` runs, as .ci/run runs it: every stage of the Makefile's
TEST_STAGES is run by some workflow job (or is in NOT_ON_GITHUB, with the reason), every `make X` names a real
target, the property-test seed is .ci/run's, and sudo hands the stages the environment the workflow sets.
"""
import glob
import itertools
import os
import re
import shlex
import unittest

import yaml  # `make unit` installs PyYAML where it is missing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOWS = os.path.join(ROOT, ".github", "workflows")
CI_WORKFLOW = "ci.yml"

# Stages of `make test` that no GitHub-hosted runner runs, and why. .ci/run runs them.
NOT_ON_GITHUB = {
    "e2e-vm": (
        "its nodes are QEMU guests whose taps share a bridge on the host (isthbr0), so traffic between pods on "
        "different nodes is bridged through the host's iptables FORWARD chain (br_netfilter); a hosted runner "
        "runs Docker, whose FORWARD policy is DROP (e2e/cluster/README.md: 'a host whose FORWARD policy is DROP "
        "(e.g. with Docker) breaks cross-node pod traffic'), and neither make test nor the cluster scripts change "
        "a machine's firewall policy. There is no kind equivalent: the point of the stage is a stock kernel's "
        "nodes, and the datapath's netem tests in that kernel run on GitHub as kernel-test"
    ),
}

# Stages that `make test` runs on the local provider and GitHub runs through kind (e2e.yml): the local provider
# needs cgroup v1 or hybrid (hosted runners mount cgroup v2 only) and a FORWARD chain that passes bridged frames
# (the runner's Docker drops them). Every other stage's clusters are the local provider's, as under `make test`.
THROUGH_KIND = {
    "cluster-smoke": "the same smoke test (e2e/cluster/smoke) on a kind cluster",
    "e2e": "the same suite (e2e/suite/run) on a kind cluster, sch_netem from the runner's kernel",
}

# Checks beyond make test that a workflow runs as a stage (make test TEST_STAGES=X, as min-k8s) through kind, and
# why: they need a full cluster, which the local provider cannot run on a hosted runner (above).
BEYOND_MAKE_TEST_THROUGH_KIND = {
    "prometheus-check": "a real Prometheus scraping every agent and the operator of a full cluster "
                        "(e2e/cluster/prometheus-check)",
}

# Stages that start no Kubernetes cluster: where another runs, the workflow names the provider.
CLUSTERLESS = {"unit", "images-test", "arm64-test", "kernel-test"}

# hashFiles patterns that may match nothing today: a cache key that names them changes once they exist.
OPTIONAL_HASH_PATTERNS = {"rust-toolchain*": "a toolchain file; the workspace has none (Cargo.toml's rust-version)"}


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def makefile_targets(text):
    targets = set()
    for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9_.-]*(?:[ \t]+[A-Za-z0-9][A-Za-z0-9_.-]*)*)[ \t]*:(?![=:])",
                         text, re.M):
        targets.update(m.group(1).split())
    return targets


def test_stages(text):
    m = re.search(r"^TEST_STAGES\s*:?=\s*(.*)$", text, re.M)
    return m.group(1).split() if m else []


def ci_run_default(name):
    """The value .ci/run gives NAME when the caller did not: `export NAME="${NAME:-VALUE}"`."""
    m = re.search(r'^export %s="\$\{%s:-([^}]*)\}"' % (name, name), read(".ci/run"), re.M)
    return m.group(1) if m else None


def matrix_combinations(job):
    """GitHub's expansion of a job's strategy.matrix: the product of its axes, less `exclude`, with `include`
    extending the combinations it does not contradict and adding the others."""
    matrix = (job.get("strategy") or {}).get("matrix")
    if not isinstance(matrix, dict):
        return [{}]
    axes = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else []
    for ex in matrix.get("exclude") or []:
        combos = [c for c in combos if not all(c.get(k) == v for k, v in ex.items())]
    originals = list(combos)
    for inc in matrix.get("include") or []:
        matched = False
        for c in originals:
            if all(c[k] == v for k, v in inc.items() if k in axes):
                c.update({k: v for k, v in inc.items() if k not in axes})
                matched = True
        if not matched:
            combos.append(dict(inc))
    return combos or [{}]


def substitute_matrix(value, combo):
    if not isinstance(value, str):
        return value
    return re.sub(r"\$\{\{\s*matrix\.([A-Za-z0-9_-]+)\s*\}\}",
                  lambda m: str(combo[m.group(1)]) if m.group(1) in combo else m.group(0), value)


def shell_commands(script):
    """Each simple command of a step's script as a token list (continuation lines joined, comments dropped)."""
    script = script.replace("\\\n", " ")
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:  # an unbalanced quote: not a line this test can read
            continue
        command = []
        for t in tokens:
            if t and set(t) <= set(";&|()"):
                if command:
                    yield command
                command = []
            else:
                command.append(t)
        if command:
            yield command


def make_invocations(script):
    """(targets, variables) of each `make` in a script; make's options other than -C/-f are skipped."""
    for command in shell_commands(script):
        idx = [i for i, t in enumerate(command) if t == "make" or t.endswith("/make")]
        if not idx:
            continue
        args = command[idx[0] + 1:]
        targets, variables, i = [], {}, 0
        other_makefile = False
        while i < len(args):
            a = args[i]
            if a in ("-C", "-f", "--directory", "--file", "--makefile"):
                other_makefile = True
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", a, re.S)
            if m:
                variables[m.group(1)] = m.group(2)
            else:
                targets.append(a)
            i += 1
        if not other_makefile:
            yield targets, variables


def github_env_writes(script):
    """NAME=VALUE lines a step appends to $GITHUB_ENV."""
    return dict(re.findall(r'echo\s+"?([A-Za-z_][A-Za-z0-9_]*)=([^"\n]*)"?\s*>>\s*"?\$\{?GITHUB_ENV\}?"?', script))


def sudo_environment(command):
    """For a command run through sudo: the names it keeps (--preserve-env=LIST, or everything with -E) and the
    ones `env NAME=VALUE` sets after sudo; None when the command is not run through sudo."""
    if "sudo" not in command:
        return None
    kept, everything = set(), False
    for t in command[command.index("sudo") + 1:]:
        if t in ("-E", "--preserve-env"):
            everything = True
        elif t.startswith("--preserve-env="):
            kept.update(n for n in t.split("=", 1)[1].split(",") if n)
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", t):
            kept.add(t.split("=", 1)[0])
        elif t == "make" or t.endswith("/make"):
            break
    return everything, kept


class Workflow:
    def __init__(self, name, doc):
        self.name, self.doc = name, doc
        # PyYAML reads the key `on` as the boolean true (YAML 1.1).
        self.on = doc.get("on", doc.get(True)) or {}
        self.jobs = doc.get("jobs") or {}


class WorkflowsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.makefile = read("Makefile")
        cls.targets = makefile_targets(cls.makefile)
        cls.stages = test_stages(cls.makefile)
        cls.workflows = []
        for path in sorted(glob.glob(os.path.join(WORKFLOWS, "*.yml")) + glob.glob(os.path.join(WORKFLOWS, "*.yaml"))):
            with open(path) as f:
                cls.workflows.append(Workflow(os.path.basename(path), yaml.safe_load(f)))
        # Every step of every matrix combination that runs `make`: (workflow, job, combo, step, targets, variables,
        # the stages of TEST_STAGES it runs, the environment the workflow gives it, the command's tokens).
        cls.runs = []
        for wf in cls.workflows:
            for job_id, job in wf.jobs.items():
                for combo in matrix_combinations(job):
                    env = {}
                    for scope in (wf.doc.get("env") or {}, job.get("env") or {}):
                        env.update({k: substitute_matrix(str(v), combo) for k, v in scope.items()})
                    for step in job.get("steps") or []:
                        script = substitute_matrix(step.get("run") or "", combo)
                        step_env = dict(env)
                        step_env.update({k: substitute_matrix(str(v), combo)
                                         for k, v in (step.get("env") or {}).items()})
                        label = substitute_matrix(step.get("name") or script.strip().split("\n")[0], combo)
                        for targets, variables in make_invocations(script):
                            runs = [t for t in targets if t in cls.stages]
                            if "test" in targets:
                                runs += variables.get("TEST_STAGES", " ".join(cls.stages)).split()
                            command = next((c for c in shell_commands(script) if "make" in c), [])
                            cls.runs.append(dict(workflow=wf.name, job=job_id, combo=combo, step=label,
                                                 targets=targets, variables=variables, stages=runs,
                                                 env=step_env, command=command))
                        # What later steps of the job get through $GITHUB_ENV.
                        env.update(github_env_writes(script))

    def where(self, r):
        combo = ", ".join(f"{k}={v}" for k, v in r["combo"].items())
        return f"{r['workflow']}: job {r['job']}{f' ({combo})' if combo else ''}, step '{r['step']}'"

    def stage_runs(self):
        return [r for r in self.runs if r["stages"]]

    def on_pull_requests(self, r):
        wf = next(w for w in self.workflows if w.name == r["workflow"])
        return "pull_request" in (wf.on if isinstance(wf.on, (dict, list)) else [wf.on])

    def test_makefile_read(self):
        self.assertIn("unit", self.stages, "Makefile: no TEST_STAGES line with unit in it")
        self.assertIn("test", self.targets, "Makefile: no `test` target")

    def test_every_stage_runs_on_github_or_says_why_not(self):
        for stage in self.stages:
            # A pull request is what a contributor sees: a release workflow's run does not count.
            where = [self.where(r) for r in self.stage_runs() if stage in r["stages"] and self.on_pull_requests(r)]
            if stage in NOT_ON_GITHUB:
                self.assertFalse(where, f"stage {stage} is in NOT_ON_GITHUB (e2e/test_workflows.py) but runs in: "
                                        f"{'; '.join(where)}; take it out of NOT_ON_GITHUB")
            else:
                self.assertTrue(where, f"stage {stage} of the Makefile's TEST_STAGES is run on pull requests by no "
                                       f"workflow job: add it to {CI_WORKFLOW}'s matrix (make test "
                                       f"TEST_STAGES={stage}), or to NOT_ON_GITHUB in e2e/test_workflows.py with "
                                       f"the reason")
        for stage in BEYOND_MAKE_TEST_THROUGH_KIND:
            self.assertIn(stage, self.targets, f"e2e/test_workflows.py names {stage}, which is no Makefile target")
            self.assertNotIn(stage, self.stages, f"{stage} is in the Makefile's TEST_STAGES: move it from "
                                                 f"BEYOND_MAKE_TEST_THROUGH_KIND (e2e/test_workflows.py) to THROUGH_KIND")
        for stage in list(NOT_ON_GITHUB) + list(THROUGH_KIND) + list(CLUSTERLESS):
            self.assertIn(stage, self.stages, f"e2e/test_workflows.py names stage {stage}, which the Makefile's "
                                              f"TEST_STAGES does not have")

    def test_every_make_target_exists(self):
        for r in self.runs:
            for target in r["targets"] + r["variables"].get("TEST_STAGES", "").split():
                self.assertTrue(target in self.targets,
                                f"{self.where(r)}: `make {target}` names no target of the Makefile")
            if "TEST_STAGES" in r["variables"]:
                self.assertIn("test", r["targets"], f"{self.where(r)}: TEST_STAGES means something only to `make test`")

    def test_property_test_seed_is_ci_runs(self):
        seed = ci_run_default("PROPTEST_RNG_SEED")
        self.assertTrue(seed, ".ci/run: no `export PROPTEST_RNG_SEED=\"${PROPTEST_RNG_SEED:-...}\"` line")
        for r in self.stage_runs():
            self.assertEqual(r["env"].get("PROPTEST_RNG_SEED"), seed,
                             f"{self.where(r)} runs {' '.join(r['stages'])} with PROPTEST_RNG_SEED="
                             f"{r['env'].get('PROPTEST_RNG_SEED')}, .ci/run with {seed}")
        for wf in self.workflows:
            text = read(f".github/workflows/{wf.name}")
            for m in re.finditer(r"PROPTEST_RNG_SEED[\"']?\s*[:=]\s*[\"']?([^\s\"']+)", text):
                self.assertEqual(m.group(1), seed, f"{wf.name}: PROPTEST_RNG_SEED {m.group(1)}, .ci/run's is {seed}")

    def test_cargo_target_dir_is_ci_runs(self):
        target_dir = ci_run_default("CARGO_TARGET_DIR")
        self.assertTrue(target_dir, ".ci/run: no `export CARGO_TARGET_DIR=\"${CARGO_TARGET_DIR:-...}\"` line")
        runs = [r for r in self.stage_runs() if r["workflow"] == CI_WORKFLOW]
        self.assertTrue(runs, f"{CI_WORKFLOW}: runs no stage of TEST_STAGES")
        for r in runs:
            self.assertEqual(r["env"].get("CARGO_TARGET_DIR"), target_dir,
                             f"{self.where(r)}: CARGO_TARGET_DIR {r['env'].get('CARGO_TARGET_DIR')}, "
                             f".ci/run's is {target_dir}")

    def test_sudo_hands_the_stage_the_workflows_environment(self):
        for r in self.stage_runs():
            kept = sudo_environment(r["command"])
            if kept is None:
                continue
            everything, names = kept
            if everything:
                continue
            for name in ("PATH", "HOME"):
                self.assertIn(name, names, f"{self.where(r)}: sudo resets {name}; pass it with env \"{name}=${name}\"")
            lost = sorted(set(r["env"]) - names)
            self.assertFalse(lost, f"{self.where(r)}: sudo drops {', '.join(lost)}, which the workflow sets for "
                                   f"{' '.join(r['stages'])}: add them to --preserve-env")

    def test_cluster_provider_is_make_tests_or_kind(self):
        for r in self.stage_runs():
            for stage in set(r["stages"]) - CLUSTERLESS:
                # The runner has kind and a Docker daemon: left unset, the cluster script would pick kind.
                kind = THROUGH_KIND.get(stage) or BEYOND_MAKE_TEST_THROUGH_KIND.get(stage)
                want = "kind" if kind else "local"
                self.assertEqual(r["env"].get("ISTHMUS_CLUSTER_PROVIDER"), want,
                                 f"{self.where(r)}: stage {stage} on ISTHMUS_CLUSTER_PROVIDER="
                                 f"{r['env'].get('ISTHMUS_CLUSTER_PROVIDER')}, expected {want}"
                                 + (f" ({kind})" if kind else " (as make test runs it)"))

    def test_a_stage_matrix_does_not_fail_fast(self):
        for wf in self.workflows:
            for job_id, job in wf.jobs.items():
                stages = {s for r in self.stage_runs() if (r["workflow"], r["job"]) == (wf.name, job_id)
                          for s in r["stages"]}
                if len(matrix_combinations(job)) > 1 and stages:
                    self.assertIs((job.get("strategy") or {}).get("fail-fast"), False,
                                  f"{wf.name}: job {job_id} runs stages {' '.join(sorted(stages))} in a matrix: "
                                  f"fail-fast: false, as make test runs every stage whatever another's result")

    def test_every_job_has_a_timeout(self):
        for wf in self.workflows:
            for job_id, job in wf.jobs.items():
                self.assertIn("timeout-minutes", job, f"{wf.name}: job {job_id} has no timeout-minutes (a hung cluster "
                                                      f"would hold the runner for GitHub's 6 hours)")

    def test_actions_are_pinned_by_major_version(self):
        for wf in self.workflows:
            for job_id, job in wf.jobs.items():
                for step in job.get("steps") or []:
                    uses = step.get("uses")
                    if uses and not uses.startswith("./"):
                        self.assertRegex(uses, r"^[\w.-]+/[\w./-]+@v\d+$",
                                         f"{wf.name}: job {job_id}: `uses: {uses}` is not pinned by major "
                                         f"version (@vN)")

    def test_go_version_file_covers_every_module(self):
        # The scripts build with GOTOOLCHAIN=local: the Go that setup-go installs must build every module.
        def go_line(path):
            m = re.search(r"^go (\d+(?:\.\d+)*)\s*$", read(path), re.M)
            return tuple(int(x) for x in m.group(1).split(".")) if m else ()
        modules = {os.path.relpath(p, ROOT): go_line(os.path.relpath(p, ROOT))
                   for p in glob.glob(os.path.join(ROOT, "e2e", "**", "go.mod"), recursive=True)}
        seen = False
        for wf in self.workflows:
            for job_id, job in wf.jobs.items():
                for step in job.get("steps") or []:
                    if not str(step.get("uses", "")).startswith("actions/setup-go@"):
                        continue
                    path = (step.get("with") or {}).get("go-version-file")
                    self.assertTrue(path, f"{wf.name}: job {job_id}: setup-go without go-version-file")
                    seen = True
                    self.assertTrue(os.path.isfile(os.path.join(ROOT, path)),
                                    f"{wf.name}: job {job_id}: go-version-file {path} does not exist")
                    have = go_line(path)
                    for mod, need in modules.items():
                        self.assertTrue(have >= need,
                                        f"{wf.name}: job {job_id}: go-version-file {path} says go "
                                        f"{'.'.join(map(str, have))}, {mod} needs go {'.'.join(map(str, need))}")
        self.assertTrue(seen, "no workflow installs Go with actions/setup-go")

    def test_hash_files_patterns_match(self):
        for wf in self.workflows:
            text = read(f".github/workflows/{wf.name}")
            for call in re.findall(r"hashFiles\(([^)]*)\)", text):
                for pattern in re.findall(r"'([^']*)'", call):
                    if pattern in OPTIONAL_HASH_PATTERNS:
                        continue
                    self.assertTrue(glob.glob(os.path.join(ROOT, pattern), recursive=True),
                                    f"{wf.name}: hashFiles pattern '{pattern}' matches no file, so the cache key "
                                    f"never changes with it")

    def test_one_rust_toolchain(self):
        toolchains = {}
        for wf in self.workflows:
            for job_id, job in wf.jobs.items():
                for step in job.get("steps") or []:
                    for command in shell_commands(step.get("run") or ""):
                        if command[:3] == ["rustup", "toolchain", "install"] or command[:2] == ["rustup", "default"]:
                            name = next((t for t in command[2:] if not t.startswith("-") and t != "install"), None)
                            toolchains.setdefault(name, []).append(f"{wf.name}: job {job_id}")
        self.assertEqual(len(toolchains), 1, f"the workflows install different Rust toolchains: {toolchains}")


if __name__ == "__main__":
    unittest.main()
