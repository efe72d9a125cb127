#!/usr/bin/env python3
"""Sets a chart copy's version, appVersion and image references for a release (e2e/release/package).

    pin_chart.py CHART_DIR VERSION COMPONENT=REPOSITORY:TAG@DIGEST...

Rewrites Chart.yaml's `version:` and `appVersion:` lines and, in values.yaml, the `repository:` and `tag:` lines
inside each COMPONENT's top-level `image:` block, leaving every other line (and comment) as it is, so the
published values.yaml reads like the one in the repository. Fails if a line to change is not found exactly once.
Stdlib only: the chart's YAML is edited by line, not re-serialised.
"""

import re
import sys


def fail(message):
    print(f"pin_chart: {message}", file=sys.stderr)
    sys.exit(1)


def set_line(text, pattern, replacement, what):
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if count != 1:
        fail(f"{what}: {count} matches for {pattern!r}, expected 1")
    return new


def pin_values(text, component, repository, tag):
    # The component's block runs from `component:` at column 0 to the next line at column 0.
    match = re.search(rf"^{re.escape(component)}:\n(?:(?:[ #].*)?\n)*", text, flags=re.MULTILINE)
    if not match:
        fail(f"values.yaml: no top-level {component}:")
    block = match.group(0)
    image = re.search(r"^  image:\n(?:(?:    .*|\s*#.*)?\n)*", block, flags=re.MULTILINE)
    if not image:
        fail(f"values.yaml: {component} has no image: block")
    new_image = set_line(image.group(0), r"^    repository: .*$", f"    repository: {repository}",
                         f"values.yaml {component}.image.repository")
    new_image = set_line(new_image, r"^    tag: .*$", f'    tag: "{tag}"', f"values.yaml {component}.image.tag")
    new_block = block.replace(image.group(0), new_image, 1)
    return text[:match.start()] + new_block + text[match.end():]


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    chart, version = argv[0], argv[1]
    with open(f"{chart}/Chart.yaml") as f:
        meta = f.read()
    meta = set_line(meta, r"^version: .*$", f"version: {version}", "Chart.yaml version")
    meta = set_line(meta, r"^appVersion: .*$", f'appVersion: "{version}"', "Chart.yaml appVersion")
    with open(f"{chart}/values.yaml") as f:
        values = f.read()
    for spec in argv[2:]:
        component, _, reference = spec.partition("=")
        name, _, digest = reference.partition("@")
        repository, _, tag = name.rpartition(":")
        if not (component and repository and tag and digest.startswith("sha256:")):
            fail(f"expected COMPONENT=REPOSITORY:TAG@sha256:DIGEST, got {spec!r}")
        values = pin_values(values, component, repository, f"{tag}@{digest}")
    with open(f"{chart}/Chart.yaml", "w") as f:
        f.write(meta)
    with open(f"{chart}/values.yaml", "w") as f:
        f.write(values)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
