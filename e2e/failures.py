#!/usr/bin/env python3
"""What failed in one stage's log, in a few lines: each failed test or scenario with its one-line reason.

    e2e/failures.py STAGE LOG      (e2e/run-stages calls it for every failed stage)

The end of a CI run's output is often all the next person sees, so `make test` ends with these lines. They are
read from what the harnesses print:
  - `FAILED: <what>: <reason>` lines, which isthmus's own runners print (the netem scenarios, the kernel rig);
  - libtest: `test NAME ... FAILED`, with the panic message from the test's captured output (`---- NAME stdout`);
  - a panic outside libtest's capture (`thread 'x' panicked at FILE:`, message on the next line);
  - cargo's compile errors (`error[E…]: …`) and the scripts' own last words (`cluster: …`, `make: *** …`).
When none of these is there, the stage's last non-empty lines stand in.
"""
import re
import sys

MAX_LINES = 8
WIDTH = 220

PANIC = re.compile(r"^thread '([^']*)' panicked at ([^:]+:\d+)(?::\d+)?:\s*(.*)$")
LIBTEST_FAILED = re.compile(r"^test (\S+) \.\.\. FAILED$")
CAPTURED = re.compile(r"^---- (\S+) stdout ----$")
OWN = re.compile(r"^\s*FAILED: (.+)$")
COMPILE = re.compile(r"^error(\[E\d+\])?: (.+)$")
SCRIPT = re.compile(r"^(cluster: .+|\[[a-z0-9-]+ [0-9:]+\] .*(fail|FAIL|error|timed out).*|.*: FAIL(ED)?\b.*)$")


def clip(text):
    text = " ".join(text.split())
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"


def panic_message(lines, start):
    """The message of the panic whose `panicked at` line is lines[start]: on that line or the next ones."""
    m = PANIC.match(lines[start])
    msg = m.group(3)
    where = m.group(2)
    if not msg:
        rest = []
        for line in lines[start + 1 : start + 4]:
            if not line.strip() or line.startswith("note: ") or line.startswith("stack backtrace"):
                break
            rest.append(line)
        msg = " ".join(rest)
    return f"{msg} ({where})"


def summarize(log):
    """Lines saying what failed, at most MAX_LINES, most specific source first."""
    lines = log.splitlines()
    found = []

    def add(line):
        line = clip(line)
        if line not in found:
            found.append(line)

    for line in lines:
        m = OWN.match(line)
        if m:
            add(m.group(1))

    # libtest: names of failed tests, then their captured panics.
    failed = [m.group(1) for m in map(LIBTEST_FAILED.match, lines) if m]
    reasons = {}
    current = None
    for i, line in enumerate(lines):
        m = CAPTURED.match(line)
        if m:
            current = m.group(1)
            continue
        if current and PANIC.match(line) and current not in reasons:
            reasons[current] = panic_message(lines, i)
        if line == "failures:" and reasons:
            current = None
    for name in failed:
        add(f"test {name}: {reasons.get(name, 'failed (no panic message in its output)')}")

    if not found:
        for i, line in enumerate(lines):
            if PANIC.match(line):
                add(f"panic: {panic_message(lines, i)}")
    if not found:
        for line in lines:
            m = COMPILE.match(line)
            if m:
                add(f"compile error: {m.group(2)}")
    if not found:
        for line in lines:
            if SCRIPT.match(line.strip()):
                add(line.strip())
    if not found:
        tail = [line for line in lines if line.strip()][-3:]
        for line in tail:
            add(line.strip())
    if len(found) > MAX_LINES:
        more = len(found) - MAX_LINES + 1
        found = found[: MAX_LINES - 1] + [f"… and {more} more (see the stage's log)"]
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: failures.py STAGE LOG")
    stage, path = sys.argv[1], sys.argv[2]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            log = f.read()
    except OSError as e:
        print(f"  {stage}: its log is unreadable ({e})")
        return
    for line in summarize(log):
        print(f"  {stage}: {line}")


if __name__ == "__main__":
    main()
